"""Compare the installed distributions with a pip-compile lock (`requirements/*.txt`), found by
its torch pin where none is given. Design: docs/design/env.md."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from lockstep.env import cuda_stack
from lockstep.errors import UsageError
from lockstep.inputs import read_bytes, read_text

LOCK_CANDIDATES = ("requirements/cpu.txt", "requirements/cuda.txt")
NAMED = 10  # packages named per kind (extra, missing, different) in a one-line difference
NOT_LOCKED = {"lockstep"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)\s*(?:;(.*))?$")


def canonicalize_name(name: str) -> str:
    """PEP 503 normalisation (packaging's own costs a slow import on the hot path)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(path: Path) -> dict[str, str]:
    """`name==version` pins of a lock, markers evaluated for this interpreter."""
    text = read_text(path, "lock file")
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith(("#", "-", "--")):
            continue
        match = _PIN.match(line)
        if not match:
            raise UsageError(f"{path}:{number}: not a pinned requirement `name==version`: {line}")
        name, version, marker = match.groups()
        if marker and not _marker_holds(marker, f"{path}:{number}"):
            continue
        pins[canonicalize_name(name)] = version
    return pins


def _marker_holds(marker: str, where: str) -> bool:
    from packaging.markers import InvalidMarker, Marker  # slow to import; few locks have markers

    try:
        return Marker(marker.strip()).evaluate()
    except InvalidMarker:
        raise UsageError(f"{where}: invalid environment marker: {marker}") from None


def find_lock(cwd: Path, torch_version: str) -> Path | None:
    local = torch_version.partition("+")[2]
    for candidate in LOCK_CANDIDATES:
        path = cwd / candidate
        if path.is_file() and _torch_local(path) == local:
            return path
    return None


def _torch_local(path: Path) -> str | None:
    """The local version of the lock's torch pin (`+cpu` -> "cpu"), without a full parse."""
    match = re.search(r"^torch\s*==\s*([^\s;\\]+)", read_text(path, "lock file"), re.MULTILINE)
    return match[1].partition("+")[2] if match else None


def compare_lock(
    path: Path, installed: dict[str, str], stack: dict[str, str | None] | None = None
) -> dict[str, object]:
    """Extra, missing and different packages of `installed` against the lock at `path`; with
    `stack` (cuda_stack.built), also torch's CUDA, cuDNN and NCCL against the lock's wheels."""
    pins = parse_lock(path)
    have = {name: v for name, v in installed.items() if name not in NOT_LOCKED}
    extra = {name: have[name] for name in sorted(have.keys() - pins.keys())}
    missing = {name: pins[name] for name in sorted(pins.keys() - have.keys())}
    different = {
        name: {"installed": have[name], "locked": pins[name]}
        for name in sorted(have.keys() & pins.keys())
        if not _same_version(have[name], pins[name])
    }
    stack_result = cuda_stack.compare(stack, pins) if stack is not None else None
    return {
        "path": str(path),
        "sha256": hashlib.sha256(read_bytes(path, "lock file")).hexdigest(),
        "matches": not (extra or missing or different)
        and (stack_result is None or stack_result["matches"]),
        "extra": extra,
        "missing": missing,
        "different": different,
        "cuda_stack": stack_result,
    }


def _same_version(a: str, b: str) -> bool:
    if a == b:
        return True
    from packaging.version import InvalidVersion, Version  # only for spellings that differ

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


# Named first: what the rest of the stack is built against.
STACK_FIRST = ("torch", "deepspeed")


def describe(lock: dict) -> str:
    """`NCCL 2.28.9 built, 2.29.7 locked; 2 extra (rich 14.1.0, tqdm 4.67.1), 1 missing
    (numpy==2.4.6), 1 different (torch 2.13.0 installed, 2.12.0 locked)`: the CUDA stack, then
    each kind's count and first NAMED packages."""
    kinds = (
        ("extra", lambda name, v: f"{name} {v}"),
        ("missing", lambda name, v: f"{name}=={v}"),
        (
            "different",
            lambda name, v: f"{name} {v.get('installed')} installed, {v.get('locked')} locked",
        ),
    )
    parts = []
    for kind, show in kinds:
        found = lock[kind]
        if not found:
            continue
        order = sorted(found, key=lambda name: name not in STACK_FIRST)  # stable otherwise
        named = [show(name, found[name]) for name in order[:NAMED]]
        more = f" and {len(found) - NAMED} more" if len(found) > NAMED else ""
        parts.append(f"{len(found)} {kind} ({', '.join(named)}{more})")
    said = [", ".join(parts)] if parts else []
    return "; ".join(list(cuda_stack.differences(lock.get("cuda_stack"))) + said) or (
        "no difference"
    )
