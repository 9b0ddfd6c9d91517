"""Every rich Console lockstep prints through, made in one place (`console`).

On a terminal a console uses the terminal's width. Piped (a CI log, `| tee`, a file) rich
would wrap every line at 80 columns; lockstep's consoles do not wrap there: a line is as long
as what it says (a table as wide as its cells), so a log can be grepped and read whole.
"""

from __future__ import annotations

import sys

# Piped: wide enough that no line of a report wraps; tables are never expanded to it.
PIPED_WIDTH = 1_000


def console(*, stderr: bool = False, file=None):
    """A rich Console on stdout (or `stderr`, or the open text `file`): no highlighting of
    numbers and paths, long text never wrapped at a word; on a terminal the terminal's width,
    piped PIPED_WIDTH."""
    from rich.console import Console

    out = Console(stderr=stderr, file=file, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = PIPED_WIDTH
    return out


def is_terminal(stream=None) -> bool:
    """Whether `stream` (default stderr) is a terminal a progress bar can redraw."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
