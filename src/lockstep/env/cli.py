"""`lockstep fingerprint` and `lockstep diff` (`lockstep preflight` is `lockstep.preflight.cli`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lockstep import flags
from lockstep.errors import EXIT_FAIL, EXIT_OK
from lockstep.inputs import existing, writable


def allow(**how):
    """`--allow FIELD`, the fields a comparison also ignores (`diff`, `preflight`)."""
    return flags.flag(
        "--allow", default=(), metavar="FIELD", **how,
        help="also ignore this field (dotted name or glob, e.g. env.NCCL_DEBUG); repeatable",
    )  # fmt: skip


@dataclass(frozen=True)
class FingerprintOptions:
    json: str | None = flags.flag(
        "--json", metavar="PATH", default=None, help="write the canonical JSON fingerprint here"
    )
    lock: str | None = flags.flag(
        "--lock", metavar="PATH", default=None, help="lock file to compare the packages with"
    )


@dataclass(frozen=True)
class DiffOptions:
    a: str = flags.flag(metavar="A.json", help="a fingerprint (lockstep fingerprint --json)")
    b: str = flags.flag(metavar="B.json", help="the fingerprint to compare it with")
    allow: tuple[str, ...] = allow()


def register(subparsers) -> None:
    flags.command(
        subparsers, "fingerprint", FingerprintOptions, fingerprint_command,
        help="fingerprint this process's environment (one rank)",
    )  # fmt: skip
    flags.command(
        subparsers, "diff", DiffOptions, diff_command,
        help="fields that differ between two fingerprints",
    )  # fmt: skip


def fingerprint_command(options: FingerprintOptions) -> int:
    from lockstep.env import fingerprint, shm
    from lockstep.env.summary import print_fingerprint

    writable(options.json, "--json")
    fp = fingerprint.collect(lock=existing(options.lock, "lock file"))
    if options.json:
        fingerprint.dump(fp, Path(options.json))
    shm_check = shm.check()
    print_fingerprint(fp, warnings=[shm_check["detail"]] if shm_check["status"] == "warn" else [])
    return EXIT_OK


def diff_command(options: DiffOptions) -> int:
    from lockstep.env import compare, fingerprint
    from lockstep.env.summary import print_diff

    a, b = fingerprint.load(Path(options.a)), fingerprint.load(Path(options.b))
    ignored = compare.Ignored(options.allow)
    fields = compare.differing_fields(a, b, ignored)
    print_diff(fields, options.a, options.b)
    return EXIT_FAIL if fields else EXIT_OK
