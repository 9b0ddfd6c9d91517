"""Which run is going and at which step, on stderr, while a launch runs (`watching`), read
from the metrics file the ranks write. Design: docs/design/launch.md
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
# a plain progress line, for a caller that wants stderr's other lines
LINE = re.compile(r"^lockstep: .+: (step \d+(/\d+)?|waiting for the first step \(.*\))$")
_STEP = re.compile(rb'"step":\s*(\d+)')
# never walked: no metrics, maybe thousands of files; hidden ones may vanish mid-walk
NOT_WALKED = frozenset({"checkpoints", "wandb", "flight-recorder"})


class StepReader:
    """The last step logged in a metrics file, or in a folder's newest since `since`."""

    def __init__(self, path: Path, since: float):
        self.path, self.since = path, since
        self.file: Path | None = None
        self.offset = 0
        self.step: int | None = None

    def current(self) -> Path | None:
        if not self.path.is_dir():
            return self.path if self.path.is_file() else None
        newest, when = None, self.since
        for folder, folders, files in os.walk(self.path):
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
    """Piped: a plain line per step, throttled; before the first, a waiting line now and then."""

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
    """On a terminal: a transient progress bar."""

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
    """Show run `name`'s steps logged to `metrics` (a file or a folder of runs) of `total`, or
    its wait for the first, on stderr while the block runs."""
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
    """A copy of stderr, taken now: a launch points descriptor 2 at a run's log."""
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
        stepped = False  # a folder's later run starts at no step: not "waiting" again
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
