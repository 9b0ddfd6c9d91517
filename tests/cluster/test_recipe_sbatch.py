"""docs/recipes/sbatch.md, as written, on the bed's real Slurm: one submission with NCCL_ALGO set
on ls1 alone (a node's drifted profile). Its preflight writes ls1, and ls1 only, to the drain
file with a `lockstep:` reason and the script resubmits itself with `--exclude=ls1`; that job's
preflight passes on the other three nodes and its training step runs there; one more node left
out is refused at once. Then the recipe's operator loop drains ls1 from the same file, with that
reason."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes" / "sbatch.md"
TIMEOUT = 300  # one job: 3 preflight ranks importing torch on a busy 2-core runner, then more
# The #SBATCH line asks for 4 nodes of 8 GPUs; on the bed, 3 of its 4 nodes with a task each
# (the resubmission, from the same script, asks the same), so 2 clean nodes outvote ls1.
SBATCH = "#SBATCH --nodes=3 --ntasks-per-node=1"
# The training step's stand-in (the recipe runs `python train.py`): each task says where it ran
# and which nodes its job was told to leave out.
TRAIN = """import os, socket
with open(f"trained-{socket.gethostname()}.txt", "w") as f:
    f.write(os.environ.get("EXCLUDED", "-"))
"""


def blocks() -> list[str]:
    """The recipe's bash blocks: the batch script, then the operator's drain loop."""
    return re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)


def finished(bed, slurm, job_id: str) -> None:
    """Wait for the batch job to leave the queue (the bed keeps no record of a finished job
    beyond `MinJobAge`, so its files say how it went)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        queued = bed.run(bed.head, ["squeue", "-h", "-j", job_id], env=slurm.env, timeout=30)
        if queued.returncode != 0 or not queued.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"job {job_id} still queued after {TIMEOUT}s: {queued.stdout}")


def test_a_node_set_apart_is_excluded_then_drained_and_the_job_trains_elsewhere(cluster, slurm):
    script, drain_loop = blocks()
    assert script.count("#SBATCH") == 1, script
    job = cluster.shared / "sbatch-recipe"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    (job / "job.sh").write_text(re.sub(r"(?m)^#SBATCH .*$", SBATCH, script))
    cluster.set_node_env(1, NCCL_ALGO="Ring")
    submitted = cluster.run(
        cluster.head, ["sbatch", "--parsable", "job.sh"], env=slurm.env, cwd=job, timeout=30
    )
    assert submitted.returncode == 0, submitted.stderr
    first = submitted.stdout.strip().split(";")[0]
    finished(cluster, slurm, first)
    out = (job / f"slurm-{first}.out").read_text()
    # the node, its reason in the form scontrol takes, and nothing else to drain
    drain = (job / f"drain-{first}.txt").read_text()
    assert re.fullmatch(r"ls1\tlockstep: [^\t\n]*NCCL_ALGO[^\t\n]*\n", drain), (drain, out[-3000:])
    assert not list(job.glob("trained-*")), out[-3000:]  # no training after a FAIL
    resubmitted = re.search(r"Submitted batch job (\d+)", out)
    assert resubmitted, out[-3000:]
    second = resubmitted.group(1)
    finished(cluster, slurm, second)
    out = (job / f"slurm-{second}.out").read_text()
    assert "PASS: 3 ranks on 3 nodes" in out, out[-3000:]
    assert (job / f"drain-{second}.txt").read_text() == ""  # nothing to drain: an empty file
    trained = {p.name: p.read_text() for p in job.glob("trained-*.txt")}
    assert trained == {f"trained-ls{k}.txt": "ls1" for k in (0, 2, 3)}, (trained, out[-3000:])
    # a later fault excluding one more node: too few remain, and sbatch says so at once
    refused = cluster.run(
        cluster.head, ["sbatch", "--exclude=ls1,ls2", "job.sh"], env=slurm.env, cwd=job, timeout=30
    )
    assert refused.returncode != 0 and "node configuration is not available" in refused.stderr, (
        refused.stderr
    )

    # the operator's way: drain what the file names, with lockstep's reason
    loop = drain_loop.replace("drain-JOBID.txt", f"drain-{first}.txt")
    drained = cluster.run(cluster.head, ["bash", "-c", loop], env=slurm.env, cwd=job, timeout=60)
    assert drained.returncode == 0, drained.stderr
    assert re.search(r"lockstep:.*\bls1\b", drained.stdout), drained.stdout  # sinfo -R's line
    node = cluster.run(
        cluster.head, ["scontrol", "show", "node", "ls1"], env=slurm.env, timeout=30
    ).stdout
    assert "DRAIN" in node and f"Reason={drain.split(chr(9))[1].strip()}" in node, node
