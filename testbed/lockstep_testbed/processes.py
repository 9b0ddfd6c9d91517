"""The host's view of the bed's processes: every pid of every node is a host pid too, so trees
are walked through /proc (`children`, `descendants`) and killed whole (`NodeProcess.kill_tree`).

Used by the bed itself (finding its inits, killing a command past its timeout), by the services
composed on it (slurm, mpi, launch) and by tests that reach a rank under its launcher.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path


class NodeProcess(subprocess.Popen):
    """A process started on a node: `node` names it, `kill_tree()` kills it and everything it
    started there (the host sees every pid of the bed)."""

    def __init__(self, args, *, node: str, argv: list[str], **kwargs):
        self.node = node
        self.argv = argv
        super().__init__(args, **kwargs)

    def kill_tree(self) -> None:
        for _ in range(3):
            pids = descendants(self.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.kill()


def children(pid: int) -> list[int]:
    """`pid`'s child processes (of every thread), [] once it is gone."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children before grandchildren."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def nspid(pid: int) -> list[int]:
    """`pid` in each PID namespace it lives in, the host's first ([] once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def descendant_nspids(pid: int) -> list[tuple[int, list[int]]]:
    """(host pid, `nspid`) of every process below `pid`."""
    return [(p, nspid(p)) for p in descendants(pid)]


def first_child(pid: int, deadline: float) -> int | None:
    """`pid`'s first child once it has one, or None at the deadline (`time.monotonic()`)."""
    while time.monotonic() < deadline:
        kids = children(pid)
        if kids:
            return kids[0]
        time.sleep(0.005)
    return None


def read_lines_until(proc: subprocess.Popen, last: str, deadline: float) -> list[str] | None:
    """Lines of `proc`'s stdout up to the line `last`, or None at EOF or the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf, lines = b"", []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                text = line.decode()
                if text == last:
                    return lines
                lines.append(text)
    finally:
        sel.close()


def tail(text: str | None, n: int = 300) -> str:
    """The last `n` characters of a command's output, for an error message."""
    text = (text or "").strip()
    return ("..." + text[-n:]) if len(text) > n else (text or "(no output)")
