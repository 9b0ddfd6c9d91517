"""One run of a user's script under the protocol (`lockstep.track`), in a folder of its own:
the one way `lockstep check --script` (`checks/script_runs.py`, several runs a check) and
`lockstep gate` (`gate/job.py`, one run a repeat) run a script once and read it back.

`run_under_protocol` clears the folder's metrics (and, unless the run resumes, its checkpoint
folder), sets the protocol's variables (metrics, max steps, checkpoint folder, resume),
launches once (`script.Script`: the launch's output in
`FOLDER/run.log`) and returns a `ProtocolRun`: where each rank's metrics are, and the triage
of a nonzero exit (`crash`: the tolerated gloo abort at exit, or the one-line cause). What a
failure means (bad input for a check, a failed job for a gate) is the caller's to say.
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
METRICS_PER_RANK = "metrics-{rank}.jsonl"  # every rank writes its own (`track.RANK_PLACEHOLDER`)
LOG = "run.log"


@dataclass(frozen=True)
class Crash:
    """A nonzero exit, triaged: `note` when it is only the known gloo abort at interpreter
    exit after a complete run (counted as finished), else `cause`, one line."""

    note: str | None = None
    cause: str | None = None


@dataclass(frozen=True)
class ProtocolRun:
    """A finished run: the protocol it ran under and its launch's `Exit`."""

    protocol: track.Protocol
    exit: Exit

    @property
    def code(self) -> int | None:
        return self.exit.code

    @property
    def timed_out(self) -> bool:
        """Killed at the timeout or at the first-step deadline (`Exit.first_step_missed`;
        `Exit.hang_report` says where its ranks were)."""
        return self.exit.code is None

    @property
    def logged_no_step(self) -> bool:
        """Rank 0's metrics file is missing or holds no whole line with a step."""
        return StepReader(self.metrics_of(0), 0.0).read() is None

    @property
    def log(self) -> Path:
        return self.exit.log

    def metrics_of(self, rank: int = 0) -> Path:
        """The metrics file rank `rank` writes (rank 0's, unless every rank writes one)."""
        return self.protocol.metrics_of(rank)

    def crash(
        self, logged: Iterable[int], *, first: int | None = None, checkpoint: Path | None = None
    ) -> Crash | None:
        """None after a clean exit; else the triage of `Exit.tolerated` and `Exit.cause`
        given the steps rank 0 logged (from `first`; with `checkpoint`, a complete run also
        left a checkpoint there)."""
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
    """Launch `script` once on `nproc` ranks with its metrics, log and (by default)
    checkpoints in `folder`; `per_rank`: every rank writes its metrics. `env` (default: this
    process's), `cwd` and `watch` (a process monitor): `Script.launch`'s. A run that does not
    `resume` starts with `checkpoint_dir` removed: one an earlier run left there (a reused
    folder) would be resumed by a script that resumes whenever it finds one."""
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
