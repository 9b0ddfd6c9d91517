"""How a hashed lock is installed, in parts, and DeepSpeed's build switches: the one source for
the images (docker/install-lock.sh, in the build) and the nox venvs (noxfile.py, which loads
this file). Standard library only: it runs with the base image's python3.

    python3 lock-parts.py LOCK PART          # that part of LOCK: its pins, hashes and via lines
    python3 lock-parts.py --switches FILE    # FILE's KEY=VALUE lines, checked, one a line

The parts, in the order they are installed:

    build-tools     pip, setuptools, wheel: first, so the lock's one sdist builds with locked tools
    torch           torch alone: a layer of its own in the images (about half the venv)
    without-sdist   every pin but the sdist (the nox venvs install torch here)
    sdist           deepspeed, the lock's only sdist: last, without build isolation, against the
                    torch installed before it, with the switches of docker/deepspeed-build.env

Exit 0, or 2 with one line on stderr (a part whose pins the lock lacks, a malformed file).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

BUILD_TOOLS = ("pip", "setuptools", "wheel")
LAYER = "torch"
SDIST = "deepspeed"
PARTS = ("build-tools", "torch", "without-sdist", "sdist")
# A pin's first line: `name==version`, then ` \` (its hashes follow) or an environment marker.
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==\S+")
SWITCH = re.compile(r"([A-Z][A-Z0-9_]*)=(\S+)")


class LockError(ValueError):
    """A lock or switches file this module will not read, or a part the lock cannot give."""


def canonical(name: str) -> str:
    """PEP 503's normal form: `Typing_Extensions` and `typing-extensions` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """Each pin of a hashed lock (canonical name -> its block: the `name==` line and the indented
    hash and via lines under it), in the lock's order. Top-level comments and blank lines are
    not part of any pin; any other top-level line (an option, an editable) is refused."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line[:1].isspace() and line.strip():
            if current is None:
                raise LockError(f"line {number}: an indented line before any pin")
            current.append(line)
            continue
        current = None
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line)
        if not match:
            raise LockError(f"line {number}: not a `name==version` pin: {line!r}")
        name = canonical(match[1])
        if name in blocks:
            raise LockError(f"line {number}: {name} is pinned twice")
        current = blocks[name] = [line]
    return {name: "\n".join(lines) + "\n" for name, lines in blocks.items()}


def select(text: str, names: Iterable[str]) -> str:
    """The pins named, in the order named; every one must be in the lock."""
    blocks = pins(text)
    wanted = [canonical(name) for name in names]
    missing = [name for name in wanted if name not in blocks]
    if missing:
        raise LockError(f"{', '.join(missing)} not pinned in the lock")
    return "".join(blocks[name] for name in wanted)


def without(text: str, names: Iterable[str]) -> str:
    """Every pin but those named (each of which must be in the lock), in the lock's order."""
    blocks = pins(text)
    dropped = {canonical(name) for name in names}
    missing = sorted(dropped - blocks.keys())
    if missing:
        raise LockError(f"{', '.join(missing)} not pinned in the lock")
    return "".join(block for name, block in blocks.items() if name not in dropped)


def part(text: str, name: str) -> str:
    """One of PARTS of a lock's text."""
    if name == "build-tools":
        return select(text, BUILD_TOOLS)
    if name == "torch":
        return select(text, (LAYER,))
    if name == "without-sdist":
        return without(text, (SDIST,))
    if name == "sdist":
        return select(text, (SDIST,))
    raise LockError(f"no part {name!r}; the parts are {', '.join(PARTS)}")


def read_switches(path: Path) -> dict[str, str]:
    """A switches file: comments, blank lines and exactly KEY=VALUE (upper-case key, one token
    of value: no quotes, spaces or expansion), each key once; in the file's order."""
    switches: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = SWITCH.fullmatch(line)
        if not match or any(c in match[2] for c in "\"'$`\\"):
            raise LockError(f"{path.name}:{number}: not KEY=VALUE: {line!r}")
        if match[1] in switches:
            raise LockError(f"{path.name}:{number}: {match[1]} is set twice")
        switches[match[1]] = match[2]
    return switches


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 2 and args[0] == "--switches":
            for key, value in read_switches(Path(args[1])).items():
                print(f"{key}={value}")
            return 0
        if len(args) == 2 and not args[0].startswith("-"):
            text = part(Path(args[0]).read_text(encoding="utf-8"), args[1])
            sys.stdout.write(text)
            return 0
        raise LockError("usage: lock-parts.py LOCK PART | lock-parts.py --switches FILE")
    except (LockError, OSError, UnicodeDecodeError) as err:
        print(f"lock-parts: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
