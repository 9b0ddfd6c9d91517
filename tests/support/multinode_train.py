"""`lockstep train` on the cluster bed, as tests/cluster's multi-node train modules run and
compare it (test_train_multinode.py, test_elastic_multinode.py): the job's argv, what a finished
run left (`Run`), and the comparisons, bitwise and after a resume.

Every run writes its metrics and checkpoints to `bed.shared` (the network filesystem's
stand-in); the final parameters are read back from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from lockstep_testbed import Cluster
from lockstep_testbed.processes import NodeProcess

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
    differ = [
        (s, a, b)
        for s, (a, b) in enumerate(zip(run.metrics(), ref.metrics(), strict=True), 1)
        if a != b
    ]
    assert not differ, f"{run.name} against {ref.name}, (step, metrics, reference): {differ}"
    assert run.digest == ref.digest, f"{run.name} {run.digest} != {ref.name} {ref.digest}"
    differ = [n for n in ref.params if not torch.equal(run.params[n], ref.params[n])]
    assert run.params.keys() == ref.params.keys() and not differ, differ


def check_ok(results: Mapping[str, subprocess.CompletedProcess], what: str) -> list[str]:
    if keep := os.environ.get("LOCKSTEP_BED_LOGS"):  # a folder: every agent's output, in full
        Path(keep).mkdir(parents=True, exist_ok=True)
        for n, r in results.items():
            (Path(keep) / f"{n}.stdout").write_text(r.stdout or "")
            (Path(keep) / f"{n}.stderr").write_text(r.stderr or "")
    bad = {n: r.stderr[-2500:] for n, r in results.items() if r.returncode}
    assert not bad, f"{what}: {bad}"
    return [r.stdout for r in results.values()]


def wait_for_checkpoint(root: Path, step: int, agents: Mapping[int, NodeProcess]) -> None:
    """Until `latest` names step `step` or a later one; fails naming the agents that exited."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        latest = latest_step(root)
        if latest >= step:
            assert latest < STEPS, f"the job reached step {latest} before the kill: too fast"
            return
        gone = {a.node: a.returncode for a in agents.values() if a.poll() is not None}
        assert not gone, f"agents exited before step {step}: {gone}"
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint of step {step} in {root} within {TIMEOUT}s")


def latest_step(root: Path) -> int:
    """The step of the checkpoint `latest` names (0: none yet)."""
    try:
        return int((root / "latest").read_text().strip()[len("step_") :])
    except (OSError, ValueError):
        return 0


def assert_resumed_and_equal(run: Run, ref: Run, killed_at: float, resume_from: int) -> None:
    """The job went on from the checkpoint of step `resume_from` (`latest` once the fault
    struck): the first step that ended after the fault (`killed_at`) is the one after it, not
    step 1, and no step up to it ran twice. The step in flight at the fault may appear twice
    in metrics.jsonl (appended by the restarted job), or once when the fault came between a
    checkpoint and the next step's end. (That a restart happened at all: the workers were
    killed before step STEPS, and every agent still exited 0 at step STEPS.)

    Then the end is the uninterrupted run's, bitwise: metrics of every step, digest and
    parameters. (It was not before `DDPEngine.prime_buckets`: a resumed 8-rank job reduced its
    first step in DDP's initial bucket layout, one ulp off by step 5 of 6, digest
    6d5c61a13ca262d0 against 240f91b3953133e0; `lockstep train --nproc 8` on one host resumed
    the same way, so it was never the bed's.)"""
    steps = [r["step"] for r in run.all_rows]
    after = [r["step"] for r in run.all_rows if r["time"] > killed_at]
    print(f"{run.name}: steps {steps}, resumed after step {resume_from}, {after} after the fault")
    assert 0 < resume_from < STEPS, f"{run.name}: latest was step {resume_from} at the fault"
    assert after and min(after) == resume_from + 1, f"{run.name}: {after} after the fault"
    again = [s for s in set(steps) if s <= resume_from and steps.count(s) > 1]
    assert not again, f"{run.name}: steps {again} ran twice: not resumed from the checkpoint"
    assert_bitwise(run, ref)
