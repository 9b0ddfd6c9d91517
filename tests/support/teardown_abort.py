"""The one failure the multi-process tests rerun for: gloo's abort at interpreter exit.

Under torch 2.13 with gloo a rank now and then dies of SIGABRT with "terminate called without
an active exception": a gloo worker thread releasing a collective's tensors is made to exit by
Python's finalization inside a noexcept destructor (README, "The protocol", from core dumps).
`destroy_process_group()` does not prevent it; ending without finalization does, and the
example scripts end with `lockstep.track.finish()`. Launches of code that still ends through
finalization (lockstep's own CLI ranks, the user-factory workers) can meet it, rarely.

A launch that failed (non-zero exit) and whose logs carry that line is rerun once, with a warning
naming it; any other failure, and the same abort twice, fails the test as before. A launch that
passed is kept even when its output quotes the line: lockstep's own note on an abort it
tolerated (at exit, after a complete run) quotes it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from subprocess import CompletedProcess

SIGNATURE = "terminate called without an active exception"


def rerun_once_on_abort(
    launch: Callable[[], CompletedProcess], logs: Callable[[CompletedProcess], str]
) -> CompletedProcess:
    """`launch()`, run again once when it failed of the known abort."""
    result = launch()
    text = logs(result)
    if result.returncode != 0 and SIGNATURE in text:
        # the rerun removes the first launch's files: keep the lines around the abort here
        at = text.index(SIGNATURE)
        warnings.warn(
            f"a rank died of SIGABRT ({SIGNATURE!r}, the known gloo abort): rerunning the "
            f"launch once; its output around the abort:\n{text[max(0, at - 3000) : at + 3000]}",
            stacklevel=2,
        )
        result = launch()
    return result
