"""Reading a launch's log: whether it shows only the known gloo abort at interpreter exit
(`aborted_at_exit`), and the script's own last error line (`last_error_line`)."""

from __future__ import annotations

import re
from pathlib import Path

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


# torchrun's failure summary: a block between two lines of 60 "=" (ChildFailedError.format_msg)
SUMMARY = re.compile(r"^={60}$.*?^={60}$", re.M | re.S)


def last_error_line(log: Path) -> str:
    """The script's own last error line, not the launcher's summary of it."""
    text = SUMMARY.sub("", log.read_text(errors="replace"))
    launcher = ("errors.html", "ChildFailedError", "elastic", "launch.py", "error_file")
    lines = [
        ln.strip() for ln in text.splitlines()
        if ln.strip() and not any(x in ln for x in launcher)
    ]  # fmt: skip
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["no output"])[-1][:300]
