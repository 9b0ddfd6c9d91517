"""The CUDA stack torch runs on (CUDA, cuDNN, NCCL), read without a GPU, against the wheels a
lock pins. Design: docs/design/env.md."""

from __future__ import annotations

import re

from lockstep import compat

# (what, the lock's wheel, version parts compared): CUDA's runtime wheel numbers its own patches
LOCKED = (
    ("cuda", re.compile(r"nvidia-cuda-runtime(?:-cu\d+)?"), 2),
    ("cudnn", re.compile(r"nvidia-cudnn-cu\d+"), 3),
    ("nccl", re.compile(r"nvidia-nccl-cu\d+"), 3),
)


def nccl_version(torch) -> str | None:
    """NCCL's version as torch loaded it; None where torch was built without NCCL."""
    if not compat.nccl_in_build(torch):
        return None
    return ".".join(map(str, torch.cuda.nccl.version()))


def cudnn_dotted(value: int | None) -> str | None:
    """torch.backends.cudnn.version()'s integer as major.minor.patch (92000 is 9.20.0, 8907 is
    8.9.7); None without cuDNN."""
    if not value:
        return None
    major, rest = (value // 10000, value % 10000) if value >= 10000 else divmod(value, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def built(torch_section: dict) -> dict[str, str | None]:
    """The fingerprint's torch section as the versions a lock is compared with."""
    return {
        "cuda": torch_section.get("cuda"),
        "cudnn": cudnn_dotted(torch_section.get("cudnn")),
        "nccl": torch_section.get("nccl"),
    }


def _cut(version: str | None, parts: int) -> str | None:
    return ".".join(version.split(".")[:parts]) if version else None


def compare(stack: dict[str, str | None], pins: dict[str, str]) -> dict | None:
    """{"matches", "versions": {what: {"built", "locked", "pin", "matches"}}} for each wheel of
    the stack the lock pins; None where it pins none."""
    versions = {}
    for what, wheel, parts in LOCKED:
        names = sorted(name for name in pins if wheel.fullmatch(name))
        if not names:
            continue
        pin = pins[names[0]]
        have, want = _cut(stack.get(what), parts), _cut(pin, parts)
        versions[what] = {
            "built": have,
            "locked": want,
            "pin": f"{names[0]}=={pin}",
            "matches": have is not None and have == want,
        }
    if not versions:
        return None
    return {"matches": all(v["matches"] for v in versions.values()), "versions": versions}


def differences(result: dict | None) -> list[str]:
    """One phrase per version that differs: `NCCL 2.29.7 built, 2.28.3 locked`."""
    labels = {"cuda": "CUDA", "cudnn": "cuDNN", "nccl": "NCCL"}
    return [
        f"{labels[what]} {row['built'] or 'none'} built, {row['locked']} locked"
        for what, row in ((result or {}).get("versions") or {}).items()
        if not row["matches"]
    ]
