"""docs/slurm.md's job-key recipe, as written, submitted with the real `sbatch` on the bed: its
preflight step gets the key (the verdict is PASS under `--require-key`), and the training
step started after it has none in its environment, on every node. The recipe before exported
the key, so every later step of the job (the training, whatever it runs) inherited it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from lockstep_testbed.namespaces import HEAD

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"
NODES = 2
TIMEOUT = 300  # two steps, the first one preflight's ranks importing torch on a busy runner
# The training step's stand-in (the recipe runs `python train.py`): each task writes what its
# environment holds.
TRAIN = """import json, os
with open(f"env-{os.environ['SLURM_PROCID']}.json", "w") as f:
    json.dump(dict(os.environ), f)
"""


def recipe() -> str:
    """The bash block of docs/slurm.md's "The job key"."""
    section = DOC.read_text().split("\n## The job key\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def finished(bed, slurm, job_id: str) -> None:
    """Wait for the batch job to leave the queue (the bed keeps no record of a finished job
    beyond `MinJobAge`, so its files say how it went)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        queued = bed.run(HEAD, ["squeue", "-h", "-j", job_id], env=slurm.env, timeout=30)
        if queued.returncode != 0 or not queued.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"job {job_id} still queued after {TIMEOUT}s: {queued.stdout}")


def test_the_training_step_after_preflight_has_no_job_key(cluster, slurm):
    script = recipe()
    assert script.count("srun ") == 2, script  # the preflight step, then the training step
    job = cluster.shared / "job-key-recipe"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    # The #SBATCH lines ask for 4 nodes of 8 GPUs; the bed's are given on the command line.
    lines = [ln for ln in script.splitlines() if not ln.startswith("#SBATCH")]
    (job / "job.sh").write_text("\n".join(lines) + "\n")
    argv = ["sbatch", "--parsable", f"--nodes={NODES}", "--ntasks-per-node=1"]
    argv += ["--output", str(job / "job.out"), str(job / "job.sh")]
    submitted = cluster.run(HEAD, argv, env=slurm.env, cwd=job, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    finished(cluster, slurm, submitted.stdout.strip().split(";")[0])
    out = (job / "job.out").read_text()
    assert f"PASS: {NODES} ranks on {NODES} nodes" in out, out[-3000:]  # the key reached it
    reports = list(job.glob("preflight-*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["authenticated"] is True
    envs = {p.name: json.loads(p.read_text()) for p in sorted(job.glob("env-*.json"))}
    assert sorted(envs) == [f"env-{k}.json" for k in range(NODES)], sorted(envs)
    for name, env in envs.items():
        assert env["SLURM_JOB_ID"] and env["SLURM_STEP_ID"] == "1", (name, env)  # the job's 2nd
        assert not [k for k in env if k.startswith("LOCKSTEP_JOB_KEY")], (name, sorted(env))
        keys = [k for k, v in env.items() if re.fullmatch(r"[0-9a-f]{64}", v)]
        assert not keys, f"{name}: a 64-hex value (the key?) under {keys}"
