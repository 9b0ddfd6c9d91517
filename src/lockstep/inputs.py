"""What lockstep reads from the user, bounded and checked: outside the bounds, a `UsageError`
naming the input, never a traceback or a wait. Design: docs/design/base.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import tomllib
from pathlib import Path

from lockstep.errors import UsageError

MAX_INPUT_BYTES = 256 * 2**20  # any file lockstep reads
MAX_DEPTH = 64
MAX_SECONDS = 7 * 24 * 3600.0  # a timeout longer than a week is a typo, not a plan

_CHUNK = 2**20
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of a regular file the user named, checked and read through one descriptor."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except OSError as err:  # ENXIO: a socket, or a device with nothing behind it
        mode = _mode(path)
        if mode is not None and not stat.S_ISREG(mode):
            raise UsageError(f"{what} {path} is {_not_a_file(mode)}: give a file") from None
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{what} {path} is {_not_a_file(mode)}: give a file")
        os.set_blocking(fd, True)  # a regular file ignores O_NONBLOCK; some network ones do not
        chunks, left = [], MAX_INPUT_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise UsageError(
                f"{what} {path} is over {MAX_INPUT_BYTES} bytes: give the {what} itself"
            )
        return b"".join(chunks)
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file the user named (`read_bytes`)."""
    try:
        return read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{what} {Path(path)} is not UTF-8 text (byte {err.start}): give the {what} itself"
        ) from None


def too_deep(what: str) -> UsageError:
    return UsageError(f"{what}: nested too deep (over {MAX_DEPTH} levels)")


def bounded_depth(value, what: str):
    """`value` (JSON or TOML) when at most MAX_DEPTH deep: later walks recurse."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise too_deep(what)
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return value


def load_json(text: str, what: str, **options):
    """`json.loads`, at most MAX_DEPTH deep; else a UsageError naming `what`."""
    try:
        return bounded_depth(json.loads(text, **options), what)
    except RecursionError:  # past the interpreter's limit
        raise too_deep(what) from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{what}: not JSON ({err.msg} at line {err.lineno})") from None
    except ValueError as err:  # int('9' * 5000): Python's digit limit
        raise UsageError(f"{what}: {str(err).split(';')[0]}") from None


def read_json(path: str | Path, what: str):
    """A JSON file the user named."""
    return load_json(read_text(path, what), f"{what} {path}")


def load_toml(text: str, what: str) -> dict:
    """`tomllib.loads`, at most MAX_DEPTH deep; else a UsageError naming `what`."""
    try:
        return bounded_depth(tomllib.loads(text), what)
    except RecursionError:
        raise too_deep(what) from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{what}: not valid TOML ({err})") from None


def read_toml(path: str | Path, what: str) -> dict:
    """A TOML file the user named."""
    return load_toml(read_text(path, what), str(path))


def writable(path: str | Path | None, what: str = "output", *, makes_folder: bool = False) -> None:
    """Refuse an output path that is a folder or whose folder is missing."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a folder; give a file name")
    if not makes_folder and not path.resolve().parent.is_dir():
        raise UsageError(f"cannot write {what} {path}: its folder does not exist")


def existing(path: str | Path | None, what: str) -> Path | None:
    """A file the user named that must exist."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise UsageError(
            f"{what} {path} does not exist" + (" as a file" if Path(path).exists() else "")
        )
    return Path(path)


# argparse types: a bad value is argparse's one-line usage error.


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def seconds(text: str) -> float:
    """A timeout: positive, finite, at most MAX_SECONDS."""
    value = positive_float(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_SECONDS:.0f} s (a week), got {text}")
    return value
