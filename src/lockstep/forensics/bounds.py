"""The most lockstep reads of a folder of flight-recorder dumps, whatever is in it: the limits,
the errors past them, and the `Budget` of memory and time the folder's dumps share.

A dump is input from outside (a job's own dumps, `lockstep forensics hang DIR`): the reader
takes at most `MAX_MEMORY` and `MAX_SECONDS` for any folder, by bounding each dimension a
file could blow up. Its size (`MAX_BYTES`, from the file's size before a byte is read), the
memory its objects take (`unpickle`'s cost of each object, a JSON dump's `json_cost`),
containers' nesting (`MAX_DEPTH`), the memo's indices, lengths a pickle claims, numbers
(sequence numbers are torch's int64, ranks below `MAX_RANKS`), the files of the folder
(`MAX_FILES`) and the time (a deadline the reader, then the analysis, look at as they go:
the analysis takes time in proportion to the entries read, whatever their sequence numbers).
"""

from __future__ import annotations

import time

MAX_BYTES = 64 * 2**20  # one dump file (torch's default 2000 entries: about 250 KB)
MAX_MEMORY = 256 * 2**20  # one folder's dumps read, their bytes while read included
MAX_SECONDS = 9.0  # reading and analysing one folder's dumps (10 s with Python's start)
MAX_DEPTH = 32  # containers in containers (a torch dump nests 5 deep)
MAX_RANKS = 1 << 16  # rank numbers below it, `--world` at most it
MAX_FILES = 4 * MAX_RANKS  # names in a dumps folder (a dump, its stacks, a report)
MAX_STACKS = 2**20  # bytes read of a rank's `.stacks` (the report shows 20 lines)
MAX_SEQ = 2**63 - 1  # a sequence number: torch's int64
NAME_COST = 256  # a folder's name, as a path in memory


class DumpError(ValueError):
    """A file that is not a flight-recorder dump lockstep can read."""


class OutOfBounds(DumpError):
    """A dump, or a folder of them, past one of the reader's bounds."""


def mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def shown(name, most: int | None = None) -> str:
    """`name` (a file's, a folder's, a dump's text) with its control characters escaped, at
    most `most` characters of it: one line, no terminal escape."""
    text = str(name)[:most]
    return (
        text
        if text.isprintable()
        else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    )


class Budget:
    """Memory (bytes as CPython lays the objects out, rounded up) and time (a deadline) for
    reading one folder's dumps; `MAX_MEMORY` and `MAX_SECONDS` unless given."""

    def __init__(self, memory: int | None = None, seconds: float | None = None):
        self.memory = MAX_MEMORY if memory is None else memory
        self.seconds = MAX_SECONDS if seconds is None else seconds
        self.deadline = time.monotonic() + self.seconds
        self.used = self.peak = 0

    def charge(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)
        if self.used > self.memory:
            raise self.over()

    def over(self) -> OutOfBounds:
        return OutOfBounds(f"over the {mib(self.memory)} lockstep reads a folder of dumps within")

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise OutOfBounds(
                f"over the {self.seconds:g} s lockstep reads and analyses a folder of dumps within"
            )


def json_cost(data: bytes) -> int:
    """At most what Python's json makes of `data`, in bytes: each value a slot and its object
    (a comma, a colon or an opening bracket starts one: 112), each list 96 and dict 232
    more, and a string's characters up to 8 bytes each (one wide character widens a whole
    string to 4 bytes a character, and the parser holds it twice as it does). Counted on the
    raw bytes (a comma in a string counts too): an upper bound."""
    lists, dicts = data.count(b"["), data.count(b"{")
    values = data.count(b",") + data.count(b":") + lists + dicts + 1
    return 8 * len(data) + 112 * values + 96 * lists + 232 * dicts
