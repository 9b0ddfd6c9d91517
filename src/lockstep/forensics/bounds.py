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
A container a pickle references many times counts at each reference, as if copied: a hash, a
`json.dumps` or a walk of the analysis expands it (`unpickle`).

What the counting misses, the floor catches: the reader runs in a fresh interpreter of its
own (`reader`) under RLIMIT_AS (`MAX_SPACE`) and RLIMIT_CPU (`MAX_CPU`), killed past
`MAX_CPU` + 2 s of wall time (`hang.report`).
"""

from __future__ import annotations

import os
import stat
import time

MAX_BYTES = 64 * 2**20  # one dump file (torch's default 2000 entries: about 250 KB)
MAX_MEMORY = 256 * 2**20  # one folder's dumps read, their bytes while read included
MAX_SECONDS = 9.0  # reading and analysing one folder's dumps (10 s with Python's start)
MAX_DEPTH = 32  # containers in containers (a torch dump nests 5 deep)
MAX_RANKS = 1 << 16  # rank numbers below it, `--world` at most it
MAX_FILES = 4 * MAX_RANKS  # names in a dumps folder (a dump, its stacks, a report)
MAX_STACKS = 2**20  # bytes read of a rank's `.stacks` (the report shows 20 lines)
MAX_SEQ = 2**63 - 1  # a sequence number: torch's int64
MAX_SIZES = 1 << 14  # numbers in an entry's input_sizes or output_sizes (a tensor list's dims)
MAX_DTYPE = 64  # characters of a dtype's name ("Float8_e4m3fnuz": 15)
NAME_COST = 256  # a folder's name, as a path in memory
# The reader's own process: the interpreter (17 MiB), MAX_MEMORY, the analysis and the report;
# CPU seconds (SIGXCPU past them, SIGKILL a second later); its report back at most MAX_REPORT.
MAX_SPACE = MAX_MEMORY + 256 * 2**20
MAX_CPU = int(MAX_SECONDS) + 1
MAX_REPORT = 16 * 2**20


class DumpError(ValueError):
    """A file that is not a flight-recorder dump lockstep can read."""


class OutOfBounds(DumpError):
    """A dump, or a folder of them, past one of the reader's bounds."""


class NotRegular(OutOfBounds):
    """A FIFO, a device, a directory where a dump or its stacks should be: never read."""


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


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device",
          stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}  # fmt: skip


def read_regular(path, limit: int, budget: Budget | None = None, cut: bool = False,
                 what: str = "a dump", tail: bool = False) -> bytes:  # fmt: skip
    """The bytes of `path`, a regular file: OutOfBounds past `limit` of them (by its size
    before a byte is read, then by what is read: /proc says 0), or with `cut` its first
    `limit` (`tail`: its last, by its size); charged to `budget`. Opened without blocking (a
    FIFO's open waits for a writer) and checked on that descriptor, not by a stat of the path
    that a rename could outrun."""
    if budget is not None:
        budget.clock()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(f"not a regular file: {_KINDS.get(stat.S_IFMT(info.st_mode), '?')}")
        if info.st_size > limit and not cut:
            raise OutOfBounds(f"{mib(info.st_size)}, over the {mib(limit)} {what} may be")
        if tail and info.st_size > limit:
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        most = limit if cut else limit + 1
        charged = min(info.st_size, most)
        if budget is not None:
            budget.charge(charged)
        parts, got = [], 0
        while got < most:  # no buffer of `most` bytes up front: it counts against RLIMIT_AS
            part = os.read(fd, min(most - got, max(info.st_size + 1 - got, 1 << 16)))
            if not part:
                break
            parts.append(part)
            got += len(part)
    finally:
        os.close(fd)
    if got > limit:
        raise OutOfBounds(f"over the {mib(limit)} {what} may be")
    if budget is not None:
        budget.charge(got - charged)
    return b"".join(parts)
