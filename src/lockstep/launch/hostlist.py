"""Slurm host lists: `gpu[01-03,07],cpu1` <-> ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"].
`expand` reads what Slurm writes; `compress` writes the short form Slurm takes back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lockstep.errors import UsageError

_MAX_HOSTS = 1 << 20


class HostlistError(UsageError):
    """A host list lockstep cannot read."""


def expand(spec: str) -> list[str]:
    """Every host of a Slurm host list, in its order."""
    text = spec.strip()
    if not text:
        raise HostlistError("empty Slurm host list")
    hosts: list[str] = []
    for part in _split_top(text, spec):
        hosts += _expand_one(part, spec)
        if len(hosts) > _MAX_HOSTS:
            raise HostlistError(f"Slurm host list {spec!r} names more than {_MAX_HOSTS} hosts")
    return hosts


def _split_top(text: str, spec: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"cannot read the Slurm host list {spec!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"cannot read the Slurm host list {spec!r}: unmatched ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"cannot read the Slurm host list {spec!r}: unclosed '['")
    parts.append(text[start:])
    if any(not p.strip() for p in parts):
        raise HostlistError(f"cannot read the Slurm host list {spec!r}: an empty entry")
    return [p.strip() for p in parts]


_GROUP = re.compile(r"\[([^\]]*)\]")
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _expand_one(part: str, spec: str) -> list[str]:
    match = _GROUP.search(part)
    if match is None:
        if not _NAME.fullmatch(part):
            raise HostlistError(f"cannot read the Slurm host list {spec!r}: bad name {part!r}")
        return [part]
    head, tail = part[: match.start()], part[match.end() :]
    if head and not _NAME.fullmatch(head):
        raise HostlistError(f"cannot read the Slurm host list {spec!r}: bad name {head!r}")
    out = []
    for middle in _range_values(match[1], spec):
        out += (
            [head + middle + rest for rest in _expand_one(tail, spec)] if tail else [head + middle]
        )
    return out


def _range_values(body: str, spec: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
        if not m:
            raise HostlistError(f"cannot read the Slurm host list {spec!r}: bad range {item!r}")
        lo, hi = m[1], m[2] if m[2] is not None else m[1]
        if int(hi) < int(lo):
            raise HostlistError(f"cannot read the Slurm host list {spec!r}: range {item!r}")
        if int(hi) - int(lo) > _MAX_HOSTS:
            raise HostlistError(f"Slurm host list {spec!r} names more than {_MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return values


def compress(names: Iterable[str]) -> str:
    """The short Slurm form of `names` (duplicates dropped, first-seen prefix order, numbers
    sorted within a prefix): ["ls0", "ls2", "ls1", "gpu07"] -> "ls[0-2],gpu07"."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, object]] = []
    for name in dict.fromkeys(names):
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            plain[name] = None
            order.append(("plain", name))
            continue
        prefix, digits = m[1], m[2]
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(("group", key))
        groups[key].append(int(digits))
    parts = []
    for kind, key in order:
        if kind == "plain":
            parts.append(key)
            continue
        prefix, width = key
        numbers = sorted(set(groups[key]))
        runs: list[tuple[int, int]] = []
        for n in numbers:
            if runs and runs[-1][1] == n - 1:
                runs[-1] = (runs[-1][0], n)
            else:
                runs.append((n, n))
        shown = [
            str(a).zfill(width) if a == b else f"{str(a).zfill(width)}-{str(b).zfill(width)}"
            for a, b in runs
        ]
        if len(numbers) == 1:
            parts.append(f"{prefix}{shown[0]}")
        else:
            parts.append(f"{prefix}[{','.join(shown)}]")
    return ",".join(parts)
