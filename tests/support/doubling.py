"""Planted hangs timed out on purpose: a timeout short enough to keep the tier fast can be too
short on a loaded machine, which then times the run out before the fault is reached."""

from __future__ import annotations

import os


def until(attempt, timeout: float, tries: int = 3):
    """`attempt(timeout)` -> (done, value) until done, doubling the timeout; the last value.
    First this process's forkserver has imported its preload (the session fixture starts it;
    its first fork waits for that), so that a timeout counts the launch, not that."""
    from lockstep.launch import forkserver_context

    ready = forkserver_context().Process(target=os.getpid)
    ready.start()
    ready.join(300)
    for _ in range(tries):
        done, value = attempt(timeout)
        if done:
            break
        timeout *= 2
    return value
