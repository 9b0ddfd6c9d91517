"""`lockstep fingerprint` and `lockstep diff` (`lockstep preflight` is `lockstep.preflight.cli`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_OK
from lockstep.inputs import existing, writable


def register(subparsers) -> None:
    fp = subparsers.add_parser(
        "fingerprint", help="fingerprint this process's environment (one rank)"
    )
    fp.add_argument("--json", metavar="PATH", help="write the canonical JSON fingerprint here")
    fp.add_argument("--lock", metavar="PATH", help="lock file to compare the packages with")
    fp.set_defaults(func=fingerprint_command)

    diff = subparsers.add_parser("diff", help="fields that differ between two fingerprints")
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    add_allow(diff)
    diff.set_defaults(func=diff_command)


def add_allow(parser: argparse.ArgumentParser) -> None:
    """`--allow FIELD`, the fields a comparison ignores (`diff`, `preflight`)."""
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="FIELD",
        help="also ignore this field (dotted name or glob, e.g. env.NCCL_DEBUG); repeatable",
    )


def fingerprint_command(args) -> int:
    from lockstep.env import fingerprint, shm
    from lockstep.env.summary import print_fingerprint

    writable(args.json, "--json")
    fp = fingerprint.collect(lock=existing(args.lock, "lock file"))
    if args.json:
        fingerprint.dump(fp, Path(args.json))
    shm_check = shm.check()
    print_fingerprint(fp, warnings=[shm_check["detail"]] if shm_check["status"] == "warn" else [])
    return EXIT_OK


def diff_command(args) -> int:
    from lockstep.env import compare, fingerprint
    from lockstep.env.summary import print_diff

    a, b = fingerprint.load(Path(args.a)), fingerprint.load(Path(args.b))
    ignored = compare.Ignored(args.allow)
    fields = compare.differing_fields(a, b, ignored)
    print_diff(fields, args.a, args.b)
    return EXIT_FAIL if fields else EXIT_OK
