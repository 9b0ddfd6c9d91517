"""A kept log scrubbed as it is written: no moment leaves a secret on disk.
Design: docs/design/redaction.md."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from lockstep.redact.forms import FULL_LINE, body_continues, body_line
from lockstep.redact.names import is_secret_name, redacted
from lockstep.redact.text import _BLOCK, add_secret_value, scrub_text

HOLD_MAX = 256 * 1024  # characters held at most for one secret
_KEY_MARK = re.compile(r"-----(?P<mark>BEGIN|END) [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_WORD = re.compile(r"[\w.-]+")
# Words whose value `text`'s forms take across a line break.
_HEADERS = frozenset({"bearer", "basic", "authorization", "proxy-authorization"})
_KINDS = ("key", "body", "block", "name")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _ends_with_name(line: str) -> bool:
    """Whether a secret's value may open the next line (`NAME=`, `--token`, `Bearer`)."""
    tail = line.rstrip()
    stripped = tail.rstrip("\"'=:,[] \t")
    m = _WORD.match(stripped[-81:][::-1])
    word, after = (m[0][::-1] if m else ""), tail[len(stripped) :]
    if word.lstrip("-").lower() in _HEADERS:
        return True
    quoted_or_set = "=" in after or "'" in after or '"' in after or word.startswith("--")
    return quoted_or_set and is_secret_name(word)


class _Open:
    """Which secrets spanning lines are open."""

    def __init__(self) -> None:
        self.key = False  # inside BEGIN ... END
        self.body = False  # a key's body without BEGIN, which may go on
        self.block: int | None = None  # a secret block scalar's indent
        self.name = False  # the last non-blank line ends with a secret's name

    def kind(self) -> str:
        """The open one ('' for none), a key first."""
        return next((k for k in _KINDS if getattr(self, k) not in (False, None)), "")

    def update(self, line: str) -> None:
        blank = not line.strip()
        if "-----" in line:
            for m in _KEY_MARK.finditer(line):  # as `text._PEM`
                self.key = m["mark"] == "BEGIN" or (self.key and m["mark"] != "END")
        self.body = not self.key and body_continues(line, self.body)
        if self.block is not None and not blank and _indent(line) <= self.block:
            self.block = None
        if (m := _BLOCK.match(line)) is not None and is_secret_name(m["name"]):
            self.block = len(m["indent"])
        if not blank:
            self.name = _ends_with_name(line)

    def carry(self, kind: str, line: str) -> tuple[bool, bool]:
        """For a secret written unfinished: whether `line` is part of it, and goes on."""
        if kind == "key":
            self.update(line)
            return True, self.key  # the END line too
        if kind == "body":
            n = body_line(line)
            return n > 0, n >= FULL_LINE
        if kind == "block":
            part = not line.strip() or _indent(line) > (self.block or 0)
            return part, part
        return bool(line.strip()), not line.strip()  # a name's: the next non-blank line


class LineScrubber:
    """Bytes in, scrubbed whole lines out; `close` gives the rest."""

    def __init__(self, hold_max: int = HOLD_MAX) -> None:
        self._partial: list[bytes] = []  # a line not ended yet, as written
        self._partial_size = 0
        self._ready: list[str] = []  # lines no open secret spans
        self._held: list[str] = []  # lines of an open secret
        self._size = 0
        self._open = _Open()
        self._carry = ""  # the kind of a secret written unfinished
        self._hold_max = hold_max

    def feed(self, data: bytes) -> bytes:
        end = data.rfind(b"\n") + 1  # the new bytes only: a long line costs once
        if not end:
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size <= self._hold_max:
                return b""
            data = b"".join(self._partial)  # a line that never ends (`\r` updates)
            end = max(data.rfind(b"\r") + 1, len(data) - self._hold_max // 2)
            self._partial = []
        whole, rest = b"".join([*self._partial, data[:end]]), data[end:]
        self._partial, self._partial_size = ([rest] if rest else []), len(rest)
        out: list[str] = []
        # cut at b"\n" before decoding: safe in UTF-8
        lines = whole.decode("utf-8", "replace").split("\n")
        for line in lines[:-1]:
            self._line(line, "\n", out)
        if lines[-1]:
            self._line(lines[-1], "", out)
        self._flush(out)
        return "".join(out).encode("utf-8")

    def close(self) -> bytes:
        out: list[str] = []
        if self._partial:
            self._line(b"".join(self._partial).decode("utf-8", "replace"), "", out)
            self._partial, self._partial_size = [], 0
        self._ready += self._held
        self._held, self._size = [], 0
        self._flush(out)
        return "".join(out).encode("utf-8")

    def _flush(self, out: list[str]) -> None:
        if self._ready:
            out.append(scrub_text("".join(self._ready)))
            self._ready = []

    def _line(self, line: str, end: str, out: list[str]) -> None:
        if self._carry:
            part, going = self._open.carry(self._carry, line)
            if part or going:
                self._flush(out)
                out.append((redacted(line) if part and line.strip() else line) + end)
                if not going:
                    self._carry, self._open = "", _Open()
                return
            self._carry, self._open = "", _Open()
        self._held.append(line + end)
        self._size += len(line) + len(end)
        self._open.update(line)
        kind = self._open.kind()
        if not kind or self._size > self._hold_max:
            self._ready += self._held
            self._held, self._size = [], 0
        if kind and not self._held:  # past `hold_max`: the rest redacted
            self._flush(out)
            self._carry = kind
            if kind == "key":  # the scrub took it to the text's end
                self._open = _Open()
                self._open.key = True


DRAIN_S = 2.0  # what the writers left, read for this long at most at the end
READ = 1 << 16
PIPE_SIZE = 1 << 20  # Linux's most for a user (/proc/sys/fs/pipe-max-size)


class _Pump(threading.Thread):
    """Reads the pipe into the log, scrubbed; never raises nor prints (stderr may be the pipe)."""

    def __init__(self, pipe: int, log: int) -> None:
        super().__init__(name="lockstep-log-scrub", daemon=True)
        self.pipe, self.log = pipe, log
        self.wake_r, self.wake_w = os.pipe()
        self.scrubber = LineScrubber()
        self.writable = True

    def run(self) -> None:
        poll = select.poll()
        poll.register(self.pipe, select.POLLIN)
        poll.register(self.wake_r, select.POLLIN)
        with contextlib.suppress(Exception):
            while True:
                ready = {fd for fd, _ in poll.poll()}
                if self.pipe in ready:
                    self._read()
                if self.wake_r in ready:
                    break
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and self._read():
            pass
        self._write(self._scrubbed(self.scrubber.close))

    def stop(self) -> None:
        os.write(self.wake_w, b"x")
        self.join(timeout=30)
        if not self.is_alive():  # else they stay open: never another file's number
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)

    def _read(self) -> bool:
        try:
            data = os.read(self.pipe, READ)
        except OSError:  # BlockingIOError: nothing there now
            return False
        if data:
            self._write(self._scrubbed(self.scrubber.feed, data))
        return bool(data)

    def _scrubbed(self, step, *args) -> bytes:
        try:
            return step(*args)
        except Exception:  # a bug in a form: the text goes, not the stream
            self.scrubber = LineScrubber()
            return b"lockstep: output left out of this log: it could not be scrubbed\n"

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.writable:
            try:
                view = view[os.write(self.log, view) :]
            except OSError:  # a full disk: the pipe is still read, so no writer waits
                self.writable = False


def _create_private(path: Path) -> int:
    """`path` made anew, 0600, never through a link."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


@contextlib.contextmanager
def scrubbing_fifo(path: str | os.PathLike) -> Iterator[Path]:
    """A named pipe whose writers' output lands in `path`, scrubbed."""
    env_key = os.environ.get("LOCKSTEP_JOB_KEY", "").strip()
    if env_key:  # a launch swaps the environment while the thread reads
        add_secret_value(env_key)
    log = _create_private(Path(path))
    folder = tempfile.mkdtemp(prefix="lockstep-log-")
    pipe, pump = -1, None
    try:
        fifo = os.path.join(folder, "output")
        os.mkfifo(fifo, 0o600)
        # read and write: opening waits for no writer, reading sees no end between writers
        pipe = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(AttributeError, OSError):  # a burst waits less on the thread
            fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        pump = _Pump(pipe, log)
        pump.start()
        try:
            yield Path(fifo)
        finally:
            pump.stop()
    finally:
        if pump is None or not pump.is_alive():
            for fd in (pipe, log):
                if fd >= 0:
                    os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
