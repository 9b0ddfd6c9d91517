"""What lockstep reads from the user, bounded and checked: a file it is given, JSON it parses, a
path it will write, a number on the command line. Anything outside the bounds is one line
(`UsageError`, exit 2) that names the input, never a traceback: a binary file, a folder where a
file should be, JSON nested past Python's recursion or a number of thousands of digits, a
timeout of `nan` or `1e300` (issue #37).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from lockstep.errors import UsageError

MAX_INPUT_BYTES = 256 * 2**20  # any file lockstep reads: goldens, metrics, configs, locks, dumps
MAX_SECONDS = 7 * 24 * 3600.0  # a timeout longer than a week is a typo, not a plan


def read_text(path: str | Path, what: str) -> str:
    """A text file the user named, as a string: missing, a folder, unreadable, over
    MAX_INPUT_BYTES or not UTF-8 text is a one-line UsageError naming `what` and the path."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise UsageError(f"{what} {path} is a folder: give a file")
        if size > MAX_INPUT_BYTES:
            raise UsageError(
                f"{what} {path} is {size} bytes, over {MAX_INPUT_BYTES}: give the {what} itself"
            )
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{what} {path} is not UTF-8 text (byte {err.start}): give the {what} itself"
        ) from None
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None


def load_json(text: str, what: str):
    """`json.loads` of `text`: nesting past Python's recursion limit, a number of more digits
    than Python converts, or malformed JSON is a one-line UsageError naming `what`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{what}: JSON nested too deep to read") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{what}: not JSON ({err.msg} at line {err.lineno})") from None
    except ValueError as err:  # int('9' * 5000): Python's digit limit
        raise UsageError(f"{what}: {str(err).split(';')[0]}") from None


def read_json(path: str | Path, what: str):
    """A JSON file the user named (`read_text`, then `load_json`)."""
    return load_json(read_text(path, what), f"{what} {path}")


def writable(path: str | Path | None, what: str = "output", *, makes_folder: bool = False) -> None:
    """Refuse, before any work, a path lockstep is to write that is a folder itself, or whose
    folder is missing (unless the writer makes it: `makes_folder`)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a folder; give a file name")
    if not makes_folder and not path.resolve().parent.is_dir():
        raise UsageError(f"cannot write {what} {path}: its folder does not exist")


def existing(path: str | Path | None, what: str) -> Path | None:
    """A file the user named that must exist (None stays None)."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise UsageError(
            f"{what} {path} does not exist" + (" as a file" if Path(path).exists() else "")
        )
    return Path(path)


# argparse value types: a bad value is argparse's own one-line usage error (exit 2).


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
