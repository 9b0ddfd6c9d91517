"""`lockstep preflight`: its flags, declared by `options.Options` (the work is `start`'s)."""

from __future__ import annotations

from lockstep import flags
from lockstep.preflight.options import Options

DESCRIPTION = (
    "Run on every rank: local checks, check-in, fingerprint comparison, collectives "
    "by value, busbw, GPU matmul checksum, and across hosts the link stage (--links). "
    "Exit 0 ok, 1 mismatch, failed check or slow node or link, 2 usage or bad input, "
    "3 timeout or missing ranks; the same on every rank."
)


def register(subparsers) -> None:
    flags.command(
        subparsers, "preflight", Options, _preflight,
        help="check every rank before the real launch (run under any launcher, or --nproc N)",
        description=DESCRIPTION,
    )  # fmt: skip


def _preflight(options: Options) -> int:
    from lockstep.preflight import start

    return start.run(options.checked())
