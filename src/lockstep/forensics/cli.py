"""`lockstep forensics hang DIR [--json]`: the report on a folder of flight-recorder dumps a
job wrote itself."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from lockstep import flags
from lockstep.inputs import positive_int


@dataclass(frozen=True)
class HangOptions:
    folder: Path = flags.flag(type=Path, metavar="DIR", help="the folder of dumps")
    world: int | None = flags.flag(
        "--world", type=positive_int, default=None, shown="as dumped", help="ranks expected"
    )
    json: bool = flags.flag("--json", default=False, help="the report as JSON")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "forensics",
        help="read a hung or crashed job's flight-recorder dumps",
        description="Forensics of a distributed job from torch's flight recorder.",
    )
    what = p.add_subparsers(dest="forensics_command", metavar="WHAT", required=True)
    flags.command(
        what, "hang", HangOptions, _hang,
        help="which collective each rank is in, and who is out of step",
        description="Read a folder of flight-recorder dumps (one file a rank, its name ending "
        "in the rank: rank_3, nccl_trace_rank_3) and say per process group and sequence number "
        "which ranks are in which collective with which sizes, which never reached it, and who "
        "is out of step. Exit 0 when nobody is, 1 when someone is, 2 when no dump could be "
        "read or one is past the reader's bounds, 4 (not judged) when every dump holds no "
        "collective (docs/forensics.md).",
    )  # fmt: skip


def _hang(args: HangOptions) -> int:
    from lockstep.errors import EXIT_FAIL, EXIT_NOT_JUDGED, EXIT_OK, UsageError
    from lockstep.forensics import hang
    from lockstep.forensics.bounds import MAX_RANKS, OutOfBounds, shown

    folder = shown(args.folder)
    if not args.folder.is_dir():
        raise UsageError(f"{folder}: no such folder")
    if args.world is not None and not 1 <= args.world <= MAX_RANKS:
        raise UsageError(f"--world must be 1..{MAX_RANKS}, got {args.world}")
    try:
        report = hang.report(args.folder, world=args.world, strict=True)
    except OutOfBounds as err:
        raise UsageError(f"{folder}: {err}") from None
    except OSError as err:
        raise UsageError(f"{folder}: {err.strerror or type(err).__name__}") from None
    if not report.versions:
        why = "; ".join(report.problems) or "no files named after a rank"
        raise UsageError(f"{folder}: no flight-recorder dump read ({why})")
    print(report.to_json() if args.json else report.text())
    if report.findings or report.no_dump:
        return EXIT_FAIL
    return EXIT_OK if report.judged else EXIT_NOT_JUDGED
