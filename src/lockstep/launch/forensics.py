"""Reading a launch's log: the known gloo abort at exit, and the script's own last error line.
Design: docs/design/launch.md"""

from __future__ import annotations

import re
from pathlib import Path

from lockstep.forensics.bounds import NotRegular, read_regular

MAX_LOG = 64 * 2**20  # a log's end: the launcher's summary, the last lines

# std::terminate's message: a gloo worker thread ended by finalization
ABORT_SIGNATURE = "terminate called without an active exception"
# faulthandler: an abort inside running Python code
IN_PYTHON = re.compile(
    r"Fatal Python error: Aborted\s*\n\s*\n[^\n]*most recent call first[^\n]*\n\s+File "
)
# each failed rank's exit code (torchrun, then the deepspeed launcher)
EXIT_CODES = re.compile(r"exitcode\s*:\s*(-?\d+)|exits with return code = (-?\d+)")


def aborted_at_exit(text: str) -> bool:
    """Only the known gloo abort at exit: the message, no Python frame, ranks dead of SIGABRT
    or SIGTERM."""
    codes = {a or b for a, b in EXIT_CODES.findall(text)}
    only_aborts = not codes or ("-6" in codes and codes <= {"-6", "-15"})
    return ABORT_SIGNATURE in text and not IN_PYTHON.search(text) and only_aborts


# torchrun's failure summary: its "=" borders are as wide as its longest line, up to 60
SUMMARY = re.compile(r"^(={10,60})$.*?^\1$", re.M | re.S)


ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\n(.*?)(?=^-{10,60}$|^={10,60}$|\Z)", re.M | re.S
)
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
LAUNCHER_LINES = ("errors.html", "ChildFailedError", "elastic", "launch.py", "error_file")


def last_error_line(log: Path) -> str:
    """The script's own last error line: the root-cause rank's, else any rank's. Read as a
    regular file: it may be a FIFO."""
    try:
        text = read_regular(log, MAX_LOG, cut=True, tail=True).decode(errors="replace")
    except NotRegular as err:
        return f"the log: {err}"
    root = root_cause(text)
    if root is not None:
        rank, traceback = root
        if line := _last_error(traceback.splitlines()):
            return line
        own = [ln for ln in text.splitlines() if (m := RANK_PREFIX.match(ln)) and int(m[1]) == rank]
        if line := _last_error(own):
            return line
    return _last_error(SUMMARY.sub("", text).splitlines()) or "no output"


def root_cause(text: str) -> tuple[int, str] | None:
    """torchrun's root cause: the rank that failed first and its traceback ('' without one)."""
    found = ROOT_CAUSE.search(text)
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", found[1], re.M) if found else None
    if rank is None:
        return None
    traceback = re.search(r"^\s*traceback\s*:(.*)", found[1], re.M | re.S)
    return int(rank[1]), traceback[1] if traceback and "errors.html" not in traceback[1] else ""


def _last_error(lines: list[str]) -> str:
    kept = [ln.strip() for ln in lines if ln.strip() and not any(x in ln for x in LAUNCHER_LINES)]
    errors = [ln for ln in kept if "Error" in ln or "error" in ln]
    return (errors or kept or [""])[-1][:300]
