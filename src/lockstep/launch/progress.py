"""Which run is going and at which step, on stderr, while a launch runs (`watching`).

A launch's ranks write their metrics as JSON lines, one per optimizer step; a thread reads the
file as it grows (or, for a folder of several runs, the newest metrics file under it) and
shows the last step logged: a progress bar on a terminal, else a plain line such as
`lockstep: world-size-2: step 3/8` at most every THROTTLE_S seconds and at the end. A run
still without a step after WAIT_S, or half its first-step deadline when sooner, says so
(`lockstep: world-size-2: waiting for the first step (30 s of 600 s)`), again every WAIT_S:
a job's set-up may take minutes, and a run that starts in seconds shows no such line. Nothing
goes to stdout, which carries the verdicts, nor into any report or run log: an in-process
launch points this process's stderr at the run's log, so the lines go to a copy of the
stderr the command started with.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from lockstep import terminal

POLL_S = 0.2
THROTTLE_S = 2.0
WAIT_S = 30.0  # piped: how often a run that has logged no step yet says it is waiting
# a plain progress line, as `_Lines` prints it (a caller that wants the other lines of stderr)
LINE = re.compile(r"^lockstep: .+: (step \d+(/\d+)?|waiting for the first step \(.*\))$")
_STEP = re.compile(rb'"step":\s*(\d+)')
# Folders a run writes that hold no metrics file and may hold thousands of files (a sharded or a
# universal checkpoint, wandb's, flight recorder dumps): never walked, five times a second.
# Hidden ones too: a checkpoint being written or converted, that vanishes mid-walk.
NOT_WALKED = frozenset({"checkpoints", "wandb", "flight-recorder"})


class StepReader:
    """The last step logged in a metrics file (`path`), or in the newest `metrics*.jsonl`
    under a folder written since `since`, read incrementally."""

    def __init__(self, path: Path, since: float):
        self.path, self.since = path, since
        self.file: Path | None = None
        self.offset = 0
        self.step: int | None = None

    def current(self) -> Path | None:
        if not self.path.is_dir():
            return self.path if self.path.is_file() else None
        newest, when = None, self.since
        for folder, folders, files in os.walk(self.path):  # a folder gone mid-walk is skipped
            folders[:] = [f for f in folders if f not in NOT_WALKED and not f.startswith(".")]
            for name in files:
                if not (name.startswith("metrics") and name.endswith(".jsonl")):
                    continue
                candidate = Path(folder, name)
                try:
                    mtime = candidate.stat().st_mtime
                except OSError:
                    continue
                if mtime >= when:
                    newest, when = candidate, mtime
        return newest

    def read(self) -> int | None:
        """The last step logged so far (None before the first)."""
        file = self.current()
        if file is None:
            return self.step
        if file != self.file:
            self.file, self.offset, self.step = file, 0, None
        try:
            with open(file, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return self.step
        end = chunk.rfind(b"\n") + 1  # whole lines only: the last may still be written
        steps = [int(m) for m in _STEP.findall(chunk[:end])]
        self.offset += end
        if steps:
            self.step = steps[-1]
        return self.step

    def label(self, name: str) -> str:
        """`name`, with the run's folder when the reader follows a folder of runs."""
        if self.path.is_dir() and self.file is not None and self.file.parent != self.path:
            return f"{name} ({self.file.parent.relative_to(self.path)})"
        return name


def _waiting(waited: float, deadline: float | None) -> str:
    limit = f" of {deadline:g} s" if deadline else ""
    return f"waiting for the first step ({waited:.0f} s{limit})"


class _Lines:
    """Piped: one plain line per new step, at most every THROTTLE_S seconds, and the last;
    before the first, a line after WAIT_S (or half the deadline) and every WAIT_S after."""

    def __init__(self, name: str, total: int | None, stream, deadline: float | None = None):
        self.name, self.total, self.stream, self.deadline = name, total, stream, deadline
        self.shown: tuple[str, int | None] | None = None
        self.when = 0.0
        self.next_wait = min(WAIT_S, deadline / 2) if deadline else WAIT_S

    def waiting(self, label: str, waited: float) -> None:
        if waited < self.next_wait:
            return
        print(f"lockstep: {label}: {_waiting(waited, self.deadline)}", file=self.stream, flush=True)
        self.next_wait = waited + WAIT_S

    def update(self, label: str, step: int | None, final: bool = False) -> None:
        if step is None or (label, step) == self.shown:
            return
        if not final and time.monotonic() - self.when < THROTTLE_S:
            return
        of = f"/{self.total}" if self.total else ""
        print(f"lockstep: {label}: step {step}{of}", file=self.stream, flush=True)
        self.shown, self.when = (label, step), time.monotonic()

    def close(self) -> None:
        pass


class _Bar:
    """On a terminal: a transient progress bar on stderr."""

    def __init__(self, name: str, total: int | None, stream, deadline: float | None = None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            console=terminal.console(file=stream),
            transient=True,
        )
        self.task = self.progress.add_task(name, total=total)
        self.deadline = deadline
        self.progress.start()

    def waiting(self, label: str, waited: float) -> None:
        self.progress.update(self.task, description=f"{label}: {_waiting(waited, self.deadline)}")

    def update(self, label: str, step: int | None, final: bool = False) -> None:
        self.progress.update(self.task, description=label, completed=step or 0)

    def close(self) -> None:
        self.progress.stop()


@contextmanager
def watching(
    name: str, metrics: Path | None, total: int | None = None, deadline: float | None = None
):
    """Show run `name`'s progress on stderr while the block runs: the steps logged to
    `metrics` (a file, or a folder whose newest metrics file is the run going) of `total`, or
    how long it has waited for the first (of `deadline` seconds, when the launch has one);
    nothing without a `metrics` path."""
    if metrics is None:
        yield
        return
    with _own_stderr() as stream:
        kind = _Bar if terminal.is_terminal(stream) else _Lines
        shown = kind(name, total, stream, deadline)
        reader = StepReader(metrics.absolute(), time.time() - 0.05)  # a coarse file clock
        with _following(reader, shown, name):
            yield


@contextmanager
def _own_stderr():
    """A stream on a copy of stderr's file descriptor, taken now: it stays the command's
    stderr while a launch points descriptor 2 at a run's log."""
    sys.stderr.flush()
    try:
        fd = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # a stderr without a descriptor
        yield sys.stderr
        return
    with open(fd, "w", buffering=1, encoding="utf-8", errors="replace") as stream:
        yield stream


@contextmanager
def _following(reader: StepReader, shown, name: str):
    stop, start = threading.Event(), time.monotonic()

    def follow() -> None:
        stepped = False  # a later run of a folder starts at no step: not "waiting" again
        while not stop.wait(POLL_S):
            step = reader.read()
            stepped = stepped or step is not None
            if stepped:
                shown.update(reader.label(name), step)
            else:
                shown.waiting(reader.label(name), time.monotonic() - start)

    thread = threading.Thread(target=follow, name="lockstep-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        step = reader.read()
        shown.update(reader.label(name), step, final=True)
        shown.close()
