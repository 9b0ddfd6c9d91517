"""Rank 0's bulk work on the link stage's records with Python's cyclic garbage collector
paused: opening the rows and deciding makes a few objects per record and per link (millions
at 64k ranks), none of them in a cycle, yet each collection triggered by their allocation
walked them all again: at 16k ranks about a third of the first pass's CPU time (issue 38).
The collector runs again afterwards, as it was; what the work left as garbage is freed then."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The block with automatic collection off (nested: the outermost turns it back on)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
