"""`lockstep gate`: record, check, compare, refresh, ab, alerts: their parsers; the work is in
`gate.commands`.

Exit codes: 0 pass, 1 regression (or an alert fired), 2 bad input or no golden for this
environment, 3 timeout, 4 not judged (a speed or memory threshold too wide to judge).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep import job_options
from lockstep.errors import EXIT_USAGE
from lockstep.inputs import positive_int

DEFAULT_DIR = "gates"
SCRIPT_STEPS = 20  # a script's steps without --steps: gate.job.DEFAULT_SCRIPT_STEPS


def register(subparsers) -> None:
    gate = subparsers.add_parser(
        "gate",
        help="regression gates: goldens per environment, performance A/B, alert rules",
        description="Did this change make training worse than main did? Goldens live in "
        "DIR/NAME/ENV-KEY.json (default dir: gates).",
    )
    sub = gate.add_subparsers(dest="gate_command", metavar="GATE_COMMAND")
    gate.set_defaults(func=lambda args: _usage(gate))

    rec = sub.add_parser("record", help="run the job R times and write its golden")
    _job_args(rec)
    rec.add_argument(
        "--repeats", type=positive_int, default=3, help="runs to take the spread from (3)"
    )
    rec.set_defaults(func=run_record)

    ref = sub.add_parser("refresh", help="record anew and show what moves from the old golden")
    _job_args(ref)
    ref.add_argument(
        "--repeats", type=positive_int, default=3, help="runs to take the spread from (3)"
    )
    ref.set_defaults(func=run_refresh)

    chk = sub.add_parser("check", help="run the job once and compare it with its golden")
    _job_args(chk)
    _report_args(chk)
    chk.add_argument(
        "--candidate",
        metavar="DIR",
        type=Path,
        help="where no golden exists for this environment, record one into DIR for a "
        "maintainer to review and commit (still exit 2)",
    )
    chk.add_argument(
        "--repeats", type=positive_int, default=3, help="runs for a --candidate golden (3)"
    )
    chk.set_defaults(func=run_check)

    cmp_ = sub.add_parser("compare", help="compare a metrics file a run already wrote")
    cmp_.add_argument("golden", type=Path, help="a golden file, e.g. gates/NAME/KEY.json")
    cmp_.add_argument("metrics", type=Path, help="metrics.jsonl of a finished run")
    _report_args(cmp_)
    cmp_.set_defaults(func=run_compare)

    ab = sub.add_parser("ab", help="alternate base REF and the working tree; judge speed/memory")
    _job_args(ab, named=False)
    _report_args(ab, plots=False)
    ab.add_argument("--base", required=True, metavar="REF", help="git ref to compare with")
    ab.add_argument("--rounds", type=positive_int, default=6, help="runs of each side (6)")
    ab.add_argument("--threshold", type=float, default=0.05, help="relative change (0.05)")
    ab.add_argument("--alpha", type=float, default=0.01, help="significance level (0.01)")
    ab.set_defaults(func=run_ab)

    al = sub.add_parser("alerts", help="evaluate alert rules over a metrics file")
    al.add_argument("rules", help="a TOML rules file, or 'default' for lockstep's rules")
    al.add_argument("metrics", type=Path, help="metrics.jsonl")
    al.add_argument("--json", type=Path, metavar="PATH", help="write the alerts as JSON")
    al.set_defaults(func=run_alerts)


def _usage(parser) -> int:
    parser.print_help()
    return EXIT_USAGE


def _job_args(p, named: bool = True) -> None:
    if named:
        p.add_argument("name", help="the gate's name: goldens live in DIR/NAME/")
    job_options.job(p, script_steps=SCRIPT_STEPS)
    p.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help="goldens' folder (gates)")
    p.add_argument("--workdir", type=Path, help="keep each run's folder here (default: temp)")


def _report_args(p, plots: bool = True) -> None:
    p.add_argument("--json", type=Path, metavar="PATH", help="write the full result as JSON")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML for CI")
    if plots:
        p.add_argument("--plot", type=Path, metavar="DIR", help="write a PNG per metric")


def _reports(args: argparse.Namespace, plots: bool = True):
    from lockstep.gate.commands import Reports

    return Reports(args.json, args.junit, args.plot if plots else None)


def _gate_run(args: argparse.Namespace, **check_only):
    from lockstep.gate.commands import GateRun

    return GateRun(
        command=args.gate_command,
        name=args.name,
        job=job_options.job_of(args),
        dir=args.dir,
        workdir=args.workdir,
        repeats=args.repeats,
        **check_only,
    )


def run_record(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    return commands.record(_gate_run(args))


def run_refresh(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    return commands.refresh(_gate_run(args))


def run_check(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    return commands.check(_gate_run(args, candidate=args.candidate, reports=_reports(args)))


def run_compare(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    return commands.compare(args.golden, args.metrics, _reports(args))


def run_ab(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    options = commands.ABRun(
        job=job_options.job_of(args),
        base=args.base,
        rounds=args.rounds,
        threshold=args.threshold,
        alpha=args.alpha,
        workdir=args.workdir,
        reports=_reports(args, plots=False),
    )
    return commands.compare_ab(options)


def run_alerts(args: argparse.Namespace) -> int:
    from lockstep.gate import commands

    return commands.evaluate_alerts(args.rules, args.metrics, args.json)
