"""One run of a user's script under the protocol, in a folder of its own, read back: the one
way `check --script` and `gate` run a script. Design: docs/design/launch.md
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lockstep import track
from lockstep.launch.progress import StepReader
from lockstep.launch.script import Exit, Script

METRICS = "metrics.jsonl"
METRICS_PER_RANK = "metrics-{rank}.jsonl"  # `track.RANK_PLACEHOLDER`
LOG = "run.log"


@dataclass(frozen=True)
class Crash:
    """A nonzero exit: `note` for the tolerated gloo abort, else `cause`."""

    note: str | None = None
    cause: str | None = None


@dataclass(frozen=True)
class ProtocolRun:
    """A finished run: its protocol and its launch's `Exit`."""

    protocol: track.Protocol
    exit: Exit

    @property
    def code(self) -> int | None:
        return self.exit.code

    @property
    def timed_out(self) -> bool:
        """Killed at the timeout or the first-step deadline."""
        return self.exit.code is None

    @property
    def logged_no_step(self) -> bool:
        """Rank 0's metrics file holds no whole line with a step."""
        return StepReader(self.metrics_of(0), 0.0).read() is None

    @property
    def log(self) -> Path:
        return self.exit.log

    def metrics_of(self, rank: int = 0) -> Path:
        """The metrics file rank `rank` writes."""
        return self.protocol.metrics_of(rank)

    def crash(
        self, logged: Iterable[int], *, first: int | None = None, checkpoint: Path | None = None
    ) -> Crash | None:
        """None after a clean exit, else its triage given the steps rank 0 logged."""
        if self.code == 0:
            return None
        logged = list(logged)
        max_steps = self.protocol.max_steps
        note = self.exit.tolerated(logged, max_steps, first=first, checkpoint=checkpoint)
        if note is not None:
            return Crash(note=note)
        return Crash(cause=self.exit.cause(logged, max_steps, first=first, checkpoint=checkpoint))


def run_under_protocol(
    script: Script,
    nproc: int,
    folder: Path,
    *,
    max_steps: int,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    per_rank: bool = False,
    env: dict | None = None,
    cwd: Path | None = None,
    watch=None,
) -> ProtocolRun:
    """Launch `script` once on `nproc` ranks, metrics, log and (by default) checkpoints in
    `folder`; `checkpoint_dir` removed first unless it resumes."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("metrics*.jsonl"):
        old.unlink()
    metrics = folder / (METRICS_PER_RANK if per_rank else METRICS)
    checkpoint_dir = checkpoint_dir or folder / "checkpoints"
    if not resume:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    protocol = track.Protocol(metrics, max_steps, checkpoint_dir, resume)
    done = script.launch(nproc, protocol, folder / LOG, env=env, cwd=cwd, watch=watch)
    return ProtocolRun(protocol, done)
