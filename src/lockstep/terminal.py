"""Every rich Console lockstep prints through: piped, no line wraps, so a log greps whole."""

from __future__ import annotations

import sys

# piped: no report line wraps
PIPED_WIDTH = 1_000


def console(*, stderr: bool = False, file=None):
    """A rich Console on stdout (or `stderr`, or `file`), without highlighting."""
    from rich.console import Console

    out = Console(stderr=stderr, file=file, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = PIPED_WIDTH
    return out


def is_terminal(stream=None) -> bool:
    """Whether `stream` (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
