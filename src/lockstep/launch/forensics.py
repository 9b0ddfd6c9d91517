"""Reading a launch's log: whether it shows only the known gloo abort at interpreter exit
(`aborted_at_exit`), and the script's own last error line (`last_error_line`)."""

from __future__ import annotations

import re
from pathlib import Path

from lockstep.forensics.bounds import NotRegular, read_regular

MAX_LOG = 64 * 2**20  # bytes read from a log's end: the launcher's summary, the last lines

# libstdc++'s std::terminate message: a gloo worker thread made to exit by Python's
# finalization inside a noexcept destructor (docs/scripts.md, "The protocol"; `track.finish`).
ABORT_SIGNATURE = "terminate called without an active exception"
# faulthandler's report of an abort inside running Python code (at exit there is none, or
# "<no Python frame>")
IN_PYTHON = re.compile(
    r"Fatal Python error: Aborted\s*\n\s*\n[^\n]*most recent call first[^\n]*\n\s+File "
)
# the launchers' summaries of each failed rank (torchrun, then the deepspeed launcher)
EXIT_CODES = re.compile(r"exitcode\s*:\s*(-?\d+)|exits with return code = (-?\d+)")


def aborted_at_exit(text: str) -> bool:
    """A launch's log shows only the known gloo abort at interpreter exit: the std::terminate
    message, no Python frame running, and every failed rank died of SIGABRT (-6) or of the
    SIGTERM its launcher then sent. Whether the run was complete is the caller's to judge."""
    codes = {a or b for a, b in EXIT_CODES.findall(text)}
    only_aborts = not codes or ("-6" in codes and codes <= {"-6", "-15"})
    return ABORT_SIGNATURE in text and not IN_PYTHON.search(text) and only_aborts


# torchrun's failure summary (ChildFailedError.format_msg): a block between two borders of "=",
# as wide as its longest line up to 60: a root cause whose traceback is "Signal 6 (SIGABRT)
# received by PID 5732" gets borders of 53, which a fixed width of 60 missed (the border itself
# was then quoted as the error line)
SUMMARY = re.compile(r"^(={10,60})$.*?^\1$", re.M | re.S)


ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\n(.*?)(?=^-{10,60}$|^={10,60}$|\Z)", re.M | re.S
)
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
LAUNCHER_LINES = ("errors.html", "ChildFailedError", "elastic", "launch.py", "error_file")


def last_error_line(log: Path) -> str:
    """The script's own last error line, not the launcher's summary of it: that of the rank
    torchelastic names as the root cause (the first to fail, by time: its traceback in the
    summary, else its `[rankN]:` lines), not another rank's follow-on error ("Connection
    closed by peer"); without a root cause, the last error line of any rank. The log's last
    MAX_LOG bytes, read as a regular file: the script may have put a FIFO in its place."""
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
    """torchrun's "Root Cause (first observed failure)" section of a launch's log: the rank
    that failed first and its traceback ('' when the rank wrote no error file)."""
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
