"""`lockstep train` across real node boundaries: 4 nodes x 2 ranks under srun and under torchrun
end with the parameter digest, bitwise, of 8 ranks on one host on the same global batch, and
within the world-size check's tolerance of 1 rank; under torchrun with one restart allowed the
job survives one node's workers killed mid-run, and a whole node lost and replaced
(`--nnodes 3:4`), resuming from its checkpoint on the shared folder and ending equal to the
uninterrupted run (the elastic check, made multi-node).

Every run writes its metrics and checkpoints to `bed.shared` (the network filesystem's
stand-in); the final parameters are read back from the last checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from lockstep.checks.harness import numeric_tolerance
from lockstep.cluster import Cluster
from lockstep.cluster.bed import NodeProcess
from lockstep.cluster.launch import kill_workers, start_torchrun
from lockstep.train.config import load_config

pytestmark = pytest.mark.cluster

CONFIG = str(Path(__file__).resolve().parents[2] / "smoke" / "cpu-ddp.toml")
STEPS = 6
GLOBAL_BATCH = 64  # micro 4: 8 ranks accumulate 2, 1 rank 16
OVERRIDES = {
    "steps": STEPS,
    "batch.global_size": GLOBAL_BATCH,
    "batch.grad_accum": 0,
    "checkpoint.every": 1,
    "checkpoint.resume": "auto",
    "logging.wandb": "disabled",
    "logging.progress": "false",
}
KILL_AFTER = 2  # the elastic runs: kill once the checkpoint of this step is published
TIMEOUT = 300  # one launch: 8 ranks importing torch on a small, busy runner
METRICS = ("loss", "grad_norm", "lr")
DIGEST = re.compile(r"trained to step (\d+), parameter digest ([0-9a-f]{16})")


def train_argv(bed: Cluster, name: str) -> list[str]:
    sets = [a for key, value in OVERRIDES.items() for a in ("--set", f"{key}={value}")]
    return ["-m", "lockstep", "train", CONFIG, "--out", str(bed.shared / name), *sets]


class Run:
    """What a finished `lockstep train` left: its digest line, metrics and final parameters."""

    def __init__(self, bed: Cluster, name: str, outputs: list[str]):
        self.name, self.out = name, bed.shared / name
        found = [m for text in outputs for m in DIGEST.finditer(text)]
        assert len(found) == 1, f"{name}: expected one digest line, got {outputs}"
        assert int(found[0].group(1)) == STEPS, f"{name}: {found[0].group(0)}"
        self.digest = found[0].group(2)
        lines = (self.out / "metrics.jsonl").read_text().splitlines()
        self.all_rows = [r for r in map(json.loads, lines) if "event" not in r]
        self.rows = {r["step"]: r for r in self.all_rows}  # the last row of a step counts
        self.params = final_parameters(self.out / "checkpoints")

    def metrics(self) -> list[tuple]:
        return [tuple(self.rows[s][m] for m in METRICS) for s in sorted(self.rows)]


def final_parameters(root: Path) -> dict[str, torch.Tensor]:
    """The model of the checkpoint `latest` names (DCP, read back as one state dict)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    name = (root / "latest").read_text().strip()
    assert name == f"step_{STEPS:08d}", f"{root}: latest is {name}"
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(root / name / "dcp", Path(tmp) / "model.pt")
        return torch.load(Path(tmp) / "model.pt", weights_only=False)["model"]


def assert_bitwise(run: Run, ref: Run) -> None:
    assert run.digest == ref.digest, f"{run.name} {run.digest} != {ref.name} {ref.digest}"
    assert run.metrics() == ref.metrics(), f"{run.name}: metrics differ from {ref.name}"
    differ = [n for n in ref.params if not torch.equal(run.params[n], ref.params[n])]
    assert run.params.keys() == ref.params.keys() and not differ, differ


def check_ok(results: Mapping[str, subprocess.CompletedProcess], what: str) -> list[str]:
    bad = {n: r.stderr[-2500:] for n, r in results.items() if r.returncode}
    assert not bad, f"{what}: {bad}"
    return [r.stdout for r in results.values()]


@pytest.fixture(scope="module")
def bed(cluster):
    yield cluster


@pytest.fixture(scope="module")
def one_host(bed) -> dict[int, Run]:
    """`lockstep train --nproc 8` and `--nproc 1` on node 0: the references."""
    runs = {}
    for nproc in (8, 1):
        name = f"host-{nproc}"
        argv = [bed.python, *train_argv(bed, name), "--nproc", str(nproc)]
        result = bed.run(0, argv, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-2500:]
        runs[nproc] = Run(bed, name, [result.stdout])
    return runs


def test_one_rank_is_within_the_world_size_tolerance_of_eight(one_host):
    """The world-size check's comparison: loss, grad norm and lr per step within
    `numeric_tolerance`, final parameters within 1% of the learning rate (absolute)."""
    one, eight = one_host[1], one_host[8]
    cfg = load_config(CONFIG, [f"{k}={v}" for k, v in OVERRIDES.items()])
    rtol, atol = numeric_tolerance(cfg)
    for s in range(1, STEPS + 1):
        for m in METRICS:
            a, b = one.rows[s][m], eight.rows[s][m]
            assert abs(a - b) <= atol + rtol * abs(b), f"step {s} {m}: 1 rank {a}, 8 ranks {b}"
    param_atol = 1e-2 * cfg.optimizer.lr
    worst = max((one.params[n] - eight.params[n]).abs().max().item() for n in eight.params)
    print(f"1 rank vs 8: digests {one.digest} / {eight.digest}, max |dparam| {worst:.3g}")
    for n, want in eight.params.items():
        assert torch.allclose(one.params[n], want, rtol=rtol, atol=param_atol), n


def test_train_under_srun_on_four_nodes_equals_eight_ranks_on_one_host(bed, one_host):
    """This run had another digest before `lockstep train` gave srun's ranks their share of
    the node's cores: torch's default (every core per rank) changes CPU float sums."""
    result = bed.slurm.srun(
        [bed.python, *train_argv(bed, "srun")], ntasks_per_node=2, timeout=TIMEOUT
    )
    outputs = check_ok({"srun": result}, "srun -N4 --ntasks-per-node=2 lockstep train")
    run = Run(bed, "srun", outputs)
    assert json.loads((run.out / "run_config.json").read_text())["world_size"] == 8
    assert_bitwise(run, one_host[8])


def test_train_under_torchrun_on_four_nodes_equals_eight_ranks_on_one_host(bed, one_host):
    procs = start_torchrun(bed, train_argv(bed, "torchrun"), nproc_per_node=2)
    outputs = check_ok(bed.wait_all(procs, TIMEOUT), "torchrun on 4 nodes")
    assert_bitwise(Run(bed, "torchrun", outputs), one_host[8])


def wait_for_checkpoint(root: Path, step: int, agents: Mapping[int, NodeProcess]) -> None:
    """Until `latest` names step `step` or a later one; fails naming the agents that exited."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            latest = int((root / "latest").read_text().strip()[len("step_") :])
        except (OSError, ValueError):
            latest = 0
        if latest >= step:
            assert latest < STEPS, f"the job reached step {latest} before the kill: too fast"
            return
        gone = {a.node: a.returncode for a in agents.values() if a.poll() is not None}
        assert not gone, f"agents exited before step {step}: {gone}"
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint of step {step} in {root} within {TIMEOUT}s")


def assert_resumed_and_equal(run: Run, ref: Run) -> None:
    """Steps after the resume point appear twice in metrics.jsonl (appended by the restarted
    job); the last rows and the final parameters equal the uninterrupted run's, bitwise."""
    steps = [r["step"] for r in run.all_rows]
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    assert repeated, f"{run.name}: no step ran twice, so no restart happened: {steps}"
    print(f"{run.name}: steps {steps}, resumed after step {repeated[0] - 1}")
    assert_bitwise(run, ref)


ELASTIC_OPEN = pytest.mark.xfail(
    strict=False,
    reason="open (issue 22 phase 2b): after torchrun's restart the ranks' gloo connectFullMesh "
    "dials the first attempt's rank-0 address (the agent's shared rendezvous store keeps the "
    "default group's keys); a per-attempt PrefixStore in trainer.join_process_group is "
    "proposed, not yet proven on the bed",
)


@ELASTIC_OPEN
def test_torchrun_restarts_when_one_nodes_workers_are_killed(bed, one_host):
    """Node 2's two workers SIGKILLed mid-run (not its agent): with --max-restarts 1 every
    agent restarts its workers, the job resumes from the latest checkpoint on the shared folder
    and ends equal to the uninterrupted 8-rank run."""
    name = "elastic-workers"
    agents = start_torchrun(
        bed, train_argv(bed, name), nproc_per_node=2, extra=["--max-restarts", "1"]
    )
    wait_for_checkpoint(bed.shared / name / "checkpoints", KILL_AFTER, agents)
    killed = kill_workers(agents[2])
    outputs = check_ok(bed.wait_all(agents, TIMEOUT), f"torchrun after killing ls2's {killed}")
    assert_resumed_and_equal(Run(bed, name, outputs), one_host[8])


@ELASTIC_OPEN
def test_torchrun_resumes_when_a_node_is_lost_and_replaced(bed, one_host):
    """Node 3's agent and workers killed mid-run (the node is lost); a new agent starts on it
    (the replacement) and joins the next rendezvous round before `--nnodes 3:4` would close it
    with three nodes (last call: 30 s), so the world stays 8 ranks and the end is bitwise the
    uninterrupted run's. Node 0 is not the one lost: its agent serves the c10d store."""
    name = "elastic-node"
    extra = ["--max-restarts", "1"]
    agents = start_torchrun(bed, train_argv(bed, name), nnodes="3:4", nproc_per_node=2, extra=extra)
    wait_for_checkpoint(bed.shared / name / "checkpoints", KILL_AFTER, agents)
    lost = agents.pop(3)
    lost.kill_tree()
    lost.wait(timeout=10)
    (replacement,) = start_torchrun(
        bed, train_argv(bed, name), nodes=[3], nnodes="3:4", nproc_per_node=2, extra=extra
    ).values()
    agents[3] = replacement
    outputs = check_ok(bed.wait_all(agents, TIMEOUT), "torchrun after replacing ls3")
    run = Run(bed, name, outputs)
    assert json.loads((run.out / "run_config.json").read_text())["world_size"] == 8
    assert_resumed_and_equal(run, one_host[8])
