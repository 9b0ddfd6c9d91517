"""A user's training script run as a black box for the checks (`--script CMD`): launched a few
times through `ScriptRunner`, its per-step metrics read back. Design: docs/design/checks.md."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from lockstep import extras
from lockstep.checks.result import CheckResult, unsound
from lockstep.checks.trajectory import by_step, read_metrics
from lockstep.errors import RankTimeout, UsageError
from lockstep.job_options import FIRST_STEP_ENV
from lockstep.launch.protocol_run import ProtocolRun, run_under_protocol
from lockstep.launch.script import Script
from lockstep.run_health import update_notes

RUNS = ".lockstep-runs"  # in a check's folder: the folders its runs made there, one a line


@dataclass(frozen=True)
class Runs:
    """What the checks' runs are asked for: ranks, steps per run, the world sizes compared."""

    nproc: int
    steps: int
    sizes: list[int]


class ScriptRunner:
    """The script's runs for the checks, one per call, each in its own folder: run by
    `lockstep.launch.protocol_run`, a failed launch is bad input (after its triage there), and
    the steps logged past LOCKSTEP_MAX_STEPS are left out with a note."""

    def __init__(
        self,
        command: str,
        workdir: Path,
        timeout: float = 600.0,
        launcher: str = "torchrun",
        run_path: bool = False,
        first_step_timeout: float | None = None,
    ):
        self.script = Script(command, launcher=launcher, run_path=run_path, timeout=timeout,
                             first_step_timeout=first_step_timeout)  # fmt: skip
        extras.require("the script", extras.script_needs(command))  # before any rank starts
        self.workdir = workdir
        self.timeout = timeout
        if removed := clear_earlier_runs(workdir):
            said = f"removed the runs an earlier check left in {workdir}: {', '.join(removed)}"
            print(f"lockstep: {said} (a run would resume their checkpoints)", file=sys.stderr)
        self._claimed: set[str] = set()
        self.logs: dict[str, str] = {}
        self.notes: list[str] = []
        self.last_logged: dict[str, int] = {}  # per run: its last step, overshoot included
        self._fresh: dict[tuple[int, int], list[dict]] = {}

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def unsound(self, check: str, runs: dict[str, list[dict]]) -> CheckResult | None:
        """`check` failed, with this runner's logs and notes, when one of `runs` logged NaN
        or inf or does not train (`result.unsound`); else None, noting once what could not be
        judged (`run_health.update_notes`)."""
        bad = unsound(check, runs)
        if bad is not None:
            bad.logs, bad.notes = self.logs, self.take_notes()
            return bad
        for text in {n for records in runs.values() for n in update_notes(records)}:
            if text not in self.notes:
                self.note(text)
        return None

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.notes.append(text)

    def run(
        self,
        name: str,
        *,
        nproc: int,
        max_steps: int,
        checkpoint_dir: Path | None = None,
        resume: bool = False,
        reuse: bool = True,
        per_rank: bool = False,
        dtype: str | None = None,
        watch: Path | None = None,
        perturb: dict[str, str] | None = None,
        variables: dict[str, str] | None = None,
    ) -> list[dict] | dict[int, list[dict]]:
        """One launch; returns the metrics rank 0 wrote (`per_rank`: {rank: metrics}, every
        rank writing its own file). A failed launch is bad input. `dtype`: a replay
        (`track.replay_dtype`); `watch`: a replay recording modules (`track.watch`);
        `perturb`: variables that reorder its fp32 sums (`noise_floor`; a forked rank applies
        them as a new interpreter would, `forkserver.vector_width`); `variables`: more of the
        protocol's variables for this run (LOCKSTEP_LOCAL_BATCH).

        A fresh run (no resume, own checkpoint folder) is reused by later checks asking for
        the same ranks and steps: `check all` launches fewer runs. `reuse=False` forces a new
        launch (determinism needs two).
        """
        key = (nproc, max_steps)
        fresh = checkpoint_dir is None and not resume and not per_rank and dtype is None
        fresh = fresh and watch is None and perturb is None and variables is None
        if fresh and reuse and key in self._fresh:
            return self._fresh[key]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["LOCKSTEP_LOCAL_BATCH"] = "detect"  # what makes the world size matter (world_size)
        if dtype is not None:
            env["LOCKSTEP_DTYPE"] = dtype
        if watch is not None:
            env["LOCKSTEP_WATCH"] = str(watch)
        env.update({**(perturb or {}), **(variables or {})})
        self.logs[name] = str(self.workdir / name / "run.log")
        self._claim(self.workdir / name, checkpoint_dir, watch)
        run = run_under_protocol(self.script, nproc, self.workdir / name, max_steps=max_steps,
                                 checkpoint_dir=checkpoint_dir, resume=resume,
                                 per_rank=per_rank, env=env)  # fmt: skip
        if run.timed_out:
            raise RankTimeout(self._killed(name, nproc, run))
        zero_path = run.metrics_of(0)
        zero = self._read(name, zero_path, max_steps, None) if zero_path.is_file() else []
        crash = run.crash(sorted(by_step(zero)), checkpoint=run.protocol.checkpoint_dir)
        if crash is not None and crash.cause is not None:
            raise UsageError(f"run '{name}' exited {run.code}: {crash.cause} (log: {run.log})")
        if crash is not None:
            self.note(f"run '{name}': {crash.note}")
        records: list[dict] | dict[int, list[dict]] = zero
        if per_rank:
            records = {0: zero} | {
                r: self._read(name, run.metrics_of(r), max_steps, r) for r in range(1, nproc)
            }
            if not zero_path.is_file():
                self._read(name, zero_path, max_steps, 0)  # raises: names the missing file
        if not per_rank and not zero_path.is_file():
            read_metrics(zero_path)  # raises: names the missing file
        if fresh:
            self._fresh.setdefault(key, records)
        return records

    def _claim(self, *paths: Path | None) -> None:
        """List in RUNS the folders of the workdir a run is about to write, before it does (a
        check killed mid-run leaves them listed), for the next check there to remove."""
        names = {p.relative_to(self.workdir).parts[0] for p in paths
                 if p is not None and p.is_relative_to(self.workdir)} - self._claimed  # fmt: skip
        if names:
            self.workdir.mkdir(parents=True, exist_ok=True)
            with open(self.workdir / RUNS, "a") as fh:
                fh.writelines(f"{n}\n" for n in sorted(names))
            self._claimed |= names

    def _killed(self, name: str, nproc: int, run: ProtocolRun) -> str:
        """Why run `name` was killed, in one line: rank 0 logged no step by the first-step
        deadline (or by the timeout), with the last lines of its log, or it did not finish in
        time; what the flight recorder found last."""
        missed = run.exit.first_step_missed
        if missed is None and not run.logged_no_step:
            return (
                f"run '{name}' ({nproc} ranks) did not finish within {self.timeout:.0f} s and "
                f"was killed; log: {run.log}{run.exit.hang_report()}"
            )
        # before any step, a rank in no collective is expected: only one out of step is news
        found = run.exit.hang_report(findings_only=True)
        within = (
            f"{missed[0]:g} s (--first-step-timeout, or {FIRST_STEP_ENV})"
            if missed
            else f"{self.timeout:g} s (--timeout)"
        )
        tail = " | ".join(run.exit.tail()) or "nothing"
        return (
            f"run '{name}' ({nproc} ranks): no step logged by rank 0 within {within}, and it "
            "was killed: a script logs each optimizer step with lockstep.track.log, and a "
            f"longer set-up needs a longer deadline. Its log ends: {tail}; log: {run.log}{found}"
        )

    def _read(self, name: str, path: Path, max_steps: int, rank: int | None) -> list[dict]:
        """A run's records, without the steps past LOCKSTEP_MAX_STEPS (noted once)."""
        if rank is not None and not path.is_file():
            raise UsageError(
                f"run '{name}': rank {rank} wrote no metrics at {path}; with '{{rank}}' in "
                "LOCKSTEP_METRICS every rank must call lockstep.track.log(step, ..., model=model)"
            )
        if not path.is_file():
            return []  # judged by the caller: a crash first, else read_metrics names it
        records = read_metrics(path)
        if rank in (None, 0) and records:
            self.last_logged[name] = max(int(r["step"]) for r in records)
        over = sorted({int(r["step"]) for r in records if int(r["step"]) > max_steps})
        if over:
            if rank in (None, 0):
                self.note(
                    f"run '{name}' logged step {over[0]}"
                    + (f"..{over[-1]}" if len(over) > 1 else "")
                    + f" past LOCKSTEP_MAX_STEPS={max_steps}; ignored"
                )
            records = [r for r in records if int(r["step"]) <= max_steps]
        return records


def clear_earlier_runs(workdir: Path) -> list[str]:
    """Remove what an earlier check's runs made in `workdir`, as its RUNS lists them (a
    checkpoint left there would be resumed, a log taken for this check's); the names removed."""
    listed = workdir / RUNS
    if not listed.is_file():
        return []
    names = [n for n in listed.read_text().splitlines() if n.strip("./") and "/" not in n]
    for name in names:
        path = workdir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    listed.unlink()
    return names


def require_steps(records: list[dict], steps: int, name: str) -> None:
    """A run that logged every step 1..`steps`, else bad input."""
    logged = sorted(by_step(records))
    if logged != list(range(1, steps + 1)):
        raise UsageError(
            f"run '{name}' logged steps {logged[:3]}..{logged[-3:]}, expected 1..{steps}: "
            "the script must log every optimizer step and stop at LOCKSTEP_MAX_STEPS"
        )
