"""Compare fingerprints: flatten to dotted fields, group ranks by section digests, name outliers
and their differing fields. Design: docs/design/env.md."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from fnmatch import fnmatchcase

from lockstep.env.fingerprint import SECTIONS, canonical_json
from lockstep.launch.detect import PER_RANK_VARIABLES

DEFAULT_IGNORED = (
    "system.hostname",
    "env.CUDA_VISIBLE_DEVICES",
    *(f"env.{name}" for name in PER_RANK_VARIABLES),
    "gpus.devices.*.uuid",
    "gpus.devices.*.pci_bus_id",
    "packages.lock.path",
    "resources.disk_free_bytes",
)
DIGEST_BYTES = 16  # per section and rank in the all-gather
ABSENT = "<absent>"


def flatten(value: object, prefix: str) -> dict[str, object]:
    """{"a": {"b": [1]}} -> {"a.b.0": 1}; an empty container has no fields."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}"))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}


class Ignored:
    """The fields left out of comparisons: defaults plus `--allow` patterns."""

    def __init__(self, allow: list[str] | tuple[str, ...] = ()):
        self.patterns = (*DEFAULT_IGNORED, *allow)

    def __call__(self, field: str) -> bool:
        return any(
            field == p or field.startswith(p + ".") or fnmatchcase(field, p) for p in self.patterns
        )


def comparable(fingerprint: dict, ignored: Ignored) -> dict[str, dict[str, object]]:
    """Per section, the flattened fields that take part in comparison."""
    return {
        name: {
            field: value
            for field, value in flatten(fingerprint["sections"].get(name), name).items()
            if not ignored(field)
        }
        for name in SECTIONS
    }


def section_digests(fingerprint: dict, ignored: Ignored) -> bytes:
    """Fixed size (DIGEST_BYTES per section) whatever the fingerprint's size."""
    return b"".join(
        hashlib.sha256(canonical_json(fields).encode()).digest()[:DIGEST_BYTES]
        for fields in comparable(fingerprint, ignored).values()
    )


def group_ranks(digests: list[bytes]) -> list[list[int]]:
    """Ranks with equal digests, largest group first (ties: the group holding the lower rank)."""
    groups: dict[bytes, list[int]] = defaultdict(list)
    for rank, row in enumerate(digests):
        groups[row].append(rank)
    return sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def differing_fields(reference: dict, other: dict, ignored: Ignored) -> list[dict[str, object]]:
    """Fields whose values differ: [{"field", "value" (other), "expected" (reference)}]."""
    ref, oth = comparable(reference, ignored), comparable(other, ignored)
    out = []
    for section in SECTIONS:
        a, b = ref[section], oth[section]
        if a == b:
            continue
        for field in sorted(a.keys() | b.keys()):
            if a.get(field, ABSENT) != b.get(field, ABSENT):
                out.append(
                    {
                        "field": field,
                        "value": b.get(field, ABSENT),
                        "expected": a.get(field, ABSENT),
                    }
                )
    return out


def duplicate_gpus(identities: list[dict]) -> list[dict]:
    """Two ranks on one GPU (same host, same UUID): NCCL's `Duplicate GPU detected`."""
    holders: dict[tuple[str, str], list[int]] = defaultdict(list)
    for ident in identities:
        gpu = ident.get("gpu")
        if gpu and gpu.get("uuid"):
            holders[(ident["host"], gpu["uuid"])].append(ident["rank"])
    return [
        {"host": host, "uuid": uuid, "ranks": ranks}
        for (host, uuid), ranks in sorted(holders.items())
        if len(ranks) > 1
    ]


def compare_ranks(
    digests: list[bytes], fingerprints: dict[int, dict], identities: list[dict], ignored: Ignored
) -> dict:
    """Majority group, every outlier group with its differing fields, and how many fields
    were compared (those of the majority's representative that are not ignored).

    `fingerprints` needs only the first rank of each group (its representative).
    """
    groups = group_ranks(digests)
    majority = groups[0]
    reference = fingerprints[majority[0]]
    outliers = [
        {
            "ranks": [identities[r] for r in ranks],
            "fields": differing_fields(reference, fingerprints[ranks[0]], ignored),
        }
        for ranks in groups[1:]
    ]
    return {
        "groups": groups,
        "majority": majority,
        "outliers": outliers,
        "duplicate_gpus": duplicate_gpus(identities),
        "compared_fields": sum(len(f) for f in comparable(reference, ignored).values()),
        "ignored": list(ignored.patterns),
    }
