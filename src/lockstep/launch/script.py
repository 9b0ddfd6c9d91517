"""A user's training script under lockstep's protocol (`lockstep.track`), for `check --script`
and `gate`: `Script`, `launch` through `LAUNCHERS` (a new launcher is one function and one row),
and `Exit`'s triage. Design: docs/design/launch.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lockstep import track
from lockstep.errors import UsageError
from lockstep.launch.cleanup import killer
from lockstep.launch.forensics import (
    ABORT_SIGNATURE,
    LAUNCHER_LINES,
    SUMMARY,
    aborted_at_exit,
    last_error_line,
)
from lockstep.launch.forkserver import start_forkserver
from lockstep.launch.progress import StepReader, watching
from lockstep.launch.ranks import free_port, run_command, run_launcher
from lockstep.redact import scrubbing_fifo
from lockstep.registry import Registry


def _torchrun(argv, nproc, log, *, env, timeout, cwd, watch, run_path, forensics=None):
    """torchrun's launcher API in this process (`ranks.run_command`)."""
    return run_command(argv, nproc, log, env=env, timeout=timeout, cwd=cwd, watch=watch,
                       run_path=run_path, forensics=forensics)  # fmt: skip


def _deepspeed(argv, nproc, log, *, env, timeout, cwd, watch, run_path, forensics=None):
    """The deepspeed launcher's command (it passes --local_rank), in its own process group."""
    if not argv[0].endswith(".py"):
        raise UsageError("--launcher deepspeed runs a Python script: --script 'train.py ...'")
    command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc),
               "--master_port", str(free_port()), *argv]  # fmt: skip
    if forensics is not None:  # dumps on a crash; a timeout kills the launcher's group
        from lockstep.forensics import collect

        env = collect.environ(env, forensics)
    return run_launcher(command, log, env=env, timeout=timeout, cwd=cwd, watch=watch)


@dataclass(frozen=True)
class Launcher:
    """`start(argv, nproc, log, ...)` gives the exit code, None when killed at `timeout`;
    `needs` is {module: why} for the one-line error before any rank starts."""

    name: str
    start: Callable[..., int | None]
    needs: dict[str, str] = field(default_factory=dict)


LAUNCHERS: Registry[Launcher] = Registry("launcher", [
    Launcher("torchrun", _torchrun),
    Launcher("deepspeed", _deepspeed, needs={"deepspeed": "its launcher"}),
])  # fmt: skip


@dataclass(frozen=True)
class Exit:
    """A finished launch: exit code (None: killed at the timeout or first-step deadline), log,
    start time and the ranks' command line."""

    code: int | None
    log: Path
    started: float
    argv: list[str]
    forensics: Path | None = None  # the flight-recorder dumps' folder
    # killed for logging no step within this many seconds; its `log_tail` then (redacted)
    first_step_missed: tuple[float, list[str]] | None = None

    def tail(self) -> list[str]:
        """The last lines the ranks wrote, when the first-step deadline struck or at the end."""
        if self.first_step_missed is not None:
            return self.first_step_missed[1]
        return log_tail(self.text) if self.log.is_file() else []

    def report(self):
        """The flight recorder's report (`forensics.analysis.Report`); None without dumps."""
        if self.forensics is None or not self.forensics.is_dir():
            return None
        from lockstep.forensics import hang

        return hang.report(self.forensics, self.text)

    def hang_report(self, findings_only: bool = False) -> str:
        """The report's headlines and where the whole report is, for a timed-out launch's
        error; '' without dumps, or with `findings_only` when nobody is out of step."""
        if self.forensics is None:
            return ""
        from lockstep.forensics import hang

        return hang.summary(self.forensics, self.text, findings_only=findings_only)

    def tolerated(
        self,
        logged: Iterable[int],
        max_steps: int,
        *,
        first: int | None = None,
        checkpoint: Path | None = None,
    ) -> str | None:
        """The note when a nonzero exit is only gloo's abort at interpreter exit after a
        complete run (steps `first`..`max_steps`, and `checkpoint` written); else None."""
        steps = sorted(set(logged))
        if not (self._complete(steps, max_steps, first) and self.aborted_at_exit):
            return None
        if checkpoint is not None and not wrote_checkpoint(checkpoint, self.started):
            return None
        wrote = " and writing its checkpoint" if checkpoint is not None else ""
        done = [s for s in steps if s <= max_steps]
        return (
            f"a rank died of SIGABRT at interpreter exit ('{ABORT_SIGNATURE}', a gloo worker "
            f"thread stopped by Python's finalization) after logging all {len(done)} steps"
            f"{wrote}; counted as finished (log: {self.log}). End the script with "
            "lockstep.track.finish() to avoid it"
        )

    def cause(
        self,
        logged: Iterable[int],
        max_steps: int,
        *,
        first: int | None = None,
        checkpoint: Path | None = None,
    ) -> str:
        """Why the launch failed, in one line."""
        last = last_error_line(self.log)
        report = self.report()
        if report is not None and report.findings:
            last = f"{last}; flight recorder: {report.findings[0].headline}"
        other = other_python(self.argv)
        if other and "No module named" in last:
            return (
                f"{last}: the `{os.path.basename(other)}` on PATH ({other}) is not the "
                f"interpreter running lockstep ({sys.executable}): activate its venv, or "
                f"write the script command with that path (--script '{sys.executable} ...')"
            )
        if ABORT_SIGNATURE not in self.text:
            return last
        steps = sorted(s for s in set(logged) if s <= max_steps)
        why = "at interpreter exit" if self.aborted_at_exit else "while the script was running"
        if not self._complete(steps, max_steps, first):
            missing = f"it logged steps {_span(steps)} of 1..{max_steps}"
        elif checkpoint is not None:
            missing = "it left no complete checkpoint"
        else:
            missing = "after it logged every step"
        return f"a rank died of SIGABRT ('{ABORT_SIGNATURE}') {why}; {missing}"

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def aborted_at_exit(self) -> bool:
        return aborted_at_exit(self.text)

    @staticmethod
    def _complete(steps: list[int], max_steps: int, first: int | None) -> bool:
        steps = [s for s in steps if s <= max_steps and (first is None or s >= first)]
        start = steps[0] if first is None and steps else first
        return bool(steps) and steps == list(range(start, max_steps + 1))


def launch(
    argv: list[str],
    nproc: int,
    log: Path,
    *,
    env: dict,
    timeout: float,
    launcher: str = "torchrun",
    run_path: bool = False,
    cwd: Path | None = None,
    watch=None,
    forensics: Path | None = None,
    first_step: tuple[float, Path] | None = None,
) -> Exit:
    """Run `argv` on `nproc` local ranks through `LAUNCHERS[launcher]`, all output scrubbed
    into `log`; `watch(pid)` wraps the launch, `first_step` (seconds, metrics file) is a
    deadline for the first step."""
    started = time.time()
    if forensics is not None:
        from lockstep.forensics import hang

        hang.clear(forensics)
    if run_path and first_step is not None:
        start_forkserver()  # before the deadline's killer: the server outlives this launch
    with (
        scrubbing_fifo(log) as output,
        _first_step_deadline(first_step, log, forensics, nproc) as missed,
    ):
        code = LAUNCHERS[launcher].start(argv, nproc, output, env=env, timeout=timeout, cwd=cwd,
                                         watch=watch, run_path=run_path,
                                         forensics=forensics)  # fmt: skip
    if missed:
        return Exit(None, log, started, argv, forensics, (first_step[0], missed[0]))
    return Exit(code, log, started, argv, forensics)


# the deepspeed CLI's own lines besides LAUNCHER_LINES (its `runner.py`: the command it ran)
OWN_LINES = (*LAUNCHER_LINES, "[runner.py:")


def log_tail(text: str, lines: int = 5) -> list[str]:
    """A launch log's last `lines` lines from the ranks, each once (every rank prints the
    same), the newest last."""
    text = SUMMARY.sub("", text)
    kept = [ln.strip() for ln in text.splitlines() if not any(x in ln for x in OWN_LINES)]
    return list(dict.fromkeys(ln[:200] for ln in reversed(kept) if ln))[:lines][::-1]


@contextlib.contextmanager
def _first_step_deadline(first_step: tuple[float, Path] | None, log: Path,
                         forensics: Path | None, nproc: int):  # fmt: skip
    """While inside: a metrics file with no step `first_step[0]` seconds in puts the log's tail
    in the yielded list and kills every process started inside until the block ends."""
    missed: list[list[str]] = []
    if first_step is None:
        yield missed
        return
    seconds, metrics = first_step
    kill, ended = killer(), threading.Event()

    def expire() -> None:
        if ended.wait(seconds) or StepReader(metrics, 0).read() is not None:
            return
        from lockstep.redact import scrub_text

        missed.append(log_tail(scrub_text(log.read_text(errors="replace"))) if log.exists() else [])
        if forensics is not None:
            from lockstep.forensics import collect

            collect.request(forensics, nproc)  # every live rank dumps, then dies
        while not ended.is_set():
            kill()
            ended.wait(0.2)

    thread = threading.Thread(target=expire, name="lockstep-first-step", daemon=True)
    thread.start()
    try:
        yield missed
    finally:
        ended.set()
        thread.join()


class Script:
    """A user's script command (`--script CMD`), checked before any launch, and launched
    under the protocol: placeholders filled, LOCKSTEP_* set."""

    def __init__(self, command: str, *, launcher: str = "torchrun", run_path: bool = False,
                 timeout=600.0, first_step_timeout: float | None = None):  # fmt: skip
        if not command.strip():
            raise UsageError("--script needs a command, for example --script 'python train.py'")
        if launcher not in LAUNCHERS:
            raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        if run_path and launcher != "torchrun":
            raise UsageError("--run-path is torchrun's: drop it or --launcher deepspeed")
        if LAUNCHERS[launcher].needs:
            from lockstep import extras

            extras.require(f"--launcher {launcher}", LAUNCHERS[launcher].needs)
        self.command = command
        self.launcher = launcher
        self.run_path = run_path
        self.timeout = timeout
        self.first_step_timeout = first_step_timeout  # None: no deadline before the timeout

    def argv(self, protocol: track.Protocol) -> list[str]:
        return script_argv(self.command, protocol.values())

    def launch(
        self,
        nproc: int,
        protocol: track.Protocol,
        log: Path,
        *,
        env: dict | None = None,
        cwd: Path | None = None,
        watch=None,
    ) -> Exit:
        """One launch with `protocol`'s variables over `env` (default: this process's),
        killed when rank 0 logs no step within `first_step_timeout` seconds."""
        env = dict(os.environ if env is None else env, **protocol.environ())
        env.setdefault("PYTHONFAULTHANDLER", "1")
        metrics, deadline = protocol.metrics_of(0), self.first_step_timeout
        shown = min(deadline or self.timeout, self.timeout)  # the earlier ends the wait
        with watching(log.parent.name, metrics, protocol.max_steps, shown):
            return launch(self.argv(protocol), nproc, log, env=env, timeout=self.timeout,
                          launcher=self.launcher, run_path=self.run_path, cwd=cwd,
                          watch=watch, forensics=dumps_folder(log),
                          first_step=(deadline, metrics) if deadline else None)  # fmt: skip


def dumps_folder(log: Path) -> Path:
    """Where a launch logging to `log` has its ranks' flight-recorder dumps."""
    return log.with_name(log.name + ".flight-recorder")


def script_argv(command: str, values: dict[str, str]) -> list[str]:
    """The script's command line with the protocol's placeholders (`{max_steps}`, ...) filled."""
    argv = shlex.split(command)
    for i, arg in enumerate(argv):
        for placeholder in track.PLACEHOLDERS:
            arg = arg.replace("{" + placeholder + "}", values[placeholder])
        argv[i] = arg
    return argv


def wrote_checkpoint(folder: Path, since: float) -> bool:
    """A checkpoint a launch wrote: files, none empty, one written after the launch started
    (a resumed run's old checkpoint does not count)."""
    if not folder.is_dir():
        return False
    files = [p for p in folder.rglob("*") if p.is_file()]
    return (
        bool(files)
        and all(p.stat().st_size > 0 for p in files)
        and any(p.stat().st_mtime >= since - 1 for p in files)
    )


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def other_python(argv: list[str], path: str | None = None) -> str | None:
    """The interpreter a `python ...` command finds on `path` (default PATH) when it is not
    the one running lockstep; else None."""
    if not argv or not PYTHON_NAME.fullmatch(argv[0]):
        return None
    found = shutil.which(argv[0], path=path if path is not None else os.environ.get("PATH"))
    if found is None or _prefix(found) == _prefix(sys.executable):
        return None
    return found


def _prefix(executable: str) -> str:
    """The environment an interpreter runs in, as its startup finds it: a venv's folder
    (pyvenv.cfg found before following symlinks), else its installation."""
    here = os.path.dirname(os.path.abspath(executable))
    for folder in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return os.path.realpath(folder)
    return os.path.dirname(os.path.dirname(os.path.realpath(executable)))
