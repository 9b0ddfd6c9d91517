"""The most lockstep reads of a folder of flight-recorder dumps: the limits, the errors past
them, the `Budget` its dumps share. Design: docs/design/forensics.md.
"""

from __future__ import annotations

import os
import stat
import time

MAX_BYTES = 64 * 2**20  # one dump file
MAX_MEMORY = 256 * 2**20  # one folder's dumps, their bytes while read included
MAX_SECONDS = 9.0  # reading and analysing one folder's dumps
MAX_DEPTH = 32
MAX_RANKS = 1 << 16
MAX_FILES = 4 * MAX_RANKS  # names in a dumps folder
MAX_STACKS = 2**20  # bytes read of a rank's `.stacks`
MAX_SEQ = 2**63 - 1  # torch's int64
MAX_SIZES = 1 << 14  # numbers in an entry's input_sizes or output_sizes
MAX_DTYPE = 64  # characters of a dtype's name
NAME_COST = 256  # a folder's name, as a path in memory
# The reader's own process: address space, CPU seconds, its report's bytes.
MAX_SPACE = MAX_MEMORY + 256 * 2**20
MAX_CPU = int(MAX_SECONDS) + 1
MAX_REPORT = 16 * 2**20


class DumpError(ValueError):
    """A file that is not a flight-recorder dump lockstep can read."""


class OutOfBounds(DumpError):
    """A dump, or a folder of them, past one of the reader's bounds."""


class NotRegular(OutOfBounds):
    """A FIFO, a device, a directory where a dump should be: never read."""


def mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def shown(name, most: int | None = None) -> str:
    """`name` with its control characters escaped, at most `most` characters: one line."""
    text = str(name)[:most]
    return (
        text
        if text.isprintable()
        else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    )


class Budget:
    """Memory (bytes as CPython lays them out) and time for reading one folder's dumps."""

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
    """At most what Python's json makes of `data`, in bytes, counted on the raw bytes."""
    lists, dicts = data.count(b"["), data.count(b"{")
    values = data.count(b",") + data.count(b":") + lists + dicts + 1
    return 8 * len(data) + 112 * values + 96 * lists + 232 * dicts


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device",
          stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}  # fmt: skip


def read_regular(path, limit: int, budget: Budget | None = None, cut: bool = False,
                 what: str = "a dump", tail: bool = False) -> bytes:  # fmt: skip
    """The bytes of `path`, a regular file checked on its open descriptor: OutOfBounds past
    `limit`, or with `cut` its first `limit` (`tail`: its last)."""
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
        while got < most:  # no buffer of `most` bytes up front: RLIMIT_AS counts it
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
