"""Reading a launch's log: the one-line error quotes the root cause, never torchrun's border."""

import pytest

from lockstep.launch.forensics import last_error_line, root_cause


def summary(traceback: str, width: int) -> str:
    """torchrun's failure summary as ChildFailedError.format_msg writes it: borders as wide as
    its longest line, at most 60."""
    return "\n".join(
        [
            "=" * width,
            "in_environ FAILED",
            "-" * width,
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            "-" * width,
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-11-26_01:05:33",
            "  host      : localhost",
            "  rank      : 1 (local_rank: 1)",
            "  exitcode  : -6 (pid: 5732)",
            "  error_file: <N/A>",
            f"  traceback : {traceback}",
            "=" * width,
            "",
        ]
    )


@pytest.mark.parametrize("width", [53, 60])
def test_a_signal_root_cause_is_quoted_whatever_the_border_width(tmp_path, width):
    """A rank killed by SIGABRT first: torchrun's borders are 53 wide (its longest line), and
    the quoted line is the signal, not the border (it was `=====...` at 53)."""
    log = tmp_path / "run.log"
    text = "[rank0]: RuntimeError: Connection closed by peer\n"
    text += summary("Signal 6 (SIGABRT) received by PID 5732", width)
    log.write_text(text)
    assert root_cause(text)[0] == 1
    assert last_error_line(log) == "Signal 6 (SIGABRT) received by PID 5732"


def test_without_a_root_cause_traceback_the_script_s_own_line_is_quoted_not_the_summary(tmp_path):
    """No error file: the root cause's own `[rankN]:` lines, with a narrow summary after them."""
    log = tmp_path / "run.log"
    text = "[rank1]: ValueError: the planted error\n[rank0]: RuntimeError: Connection closed\n"
    text += summary(
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", 40
    )
    log.write_text(text)
    assert last_error_line(log) == "[rank1]: ValueError: the planted error"
