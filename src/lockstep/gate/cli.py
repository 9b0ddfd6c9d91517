"""`lockstep gate`: record, check, compare, refresh, ab, alerts.

Exit codes: 0 pass, 1 regression (or an alert fired), 2 bad input or no golden for this
environment, 3 timeout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE

DEFAULT_DIR = "gates"


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
    rec.add_argument("--repeats", type=int, default=3, help="runs to take the spread from (3)")
    rec.set_defaults(func=run_record)

    ref = sub.add_parser("refresh", help="record anew and show what moves from the old golden")
    _job_args(ref)
    ref.add_argument("--repeats", type=int, default=3, help="runs to take the spread from (3)")
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
    chk.add_argument("--repeats", type=int, default=3, help="runs for a --candidate golden (3)")
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
    ab.add_argument("--rounds", type=int, default=6, help="runs of each side (6)")
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
    p.add_argument("config", nargs="?", type=Path, help="reference job config (TOML)")
    p.add_argument("--script", metavar="CMD", help="a script speaking lockstep's protocol")
    p.add_argument("--nproc", type=int, default=1, help="ranks (default 1)")
    p.add_argument("--steps", type=int, help="optimizer steps (config: its own; script: 20)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (CONFIG jobs)",
    )
    p.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help="goldens' folder (gates)")
    p.add_argument("--workdir", type=Path, help="keep each run's folder here (default: temp)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (1800)")
    p.add_argument(
        "--run-path",
        action="store_true",
        help="as torchrun --run-path: ranks forked from a process that imported torch run the "
        "script (or -m module) with runpy; faster on CPU (docs/scripts.md)",
    )


def _report_args(p, plots: bool = True) -> None:
    p.add_argument("--json", type=Path, metavar="PATH", help="write the full result as JSON")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML for CI")
    if plots:
        p.add_argument("--plot", type=Path, metavar="DIR", help="write a PNG per metric")


def _job(args):
    from lockstep import extras
    from lockstep.gate.job import Job

    job = Job(
        nproc=args.nproc,
        steps=args.steps,
        config=args.config,
        overrides=args.overrides,
        command=args.script,
        timeout=args.timeout,
        run_path=args.run_path,
    )
    what = f"lockstep gate {args.gate_command}"
    job.require_extras(what)  # before any run starts
    if getattr(args, "plot", None):
        extras.require(f"{what} --plot", {"matplotlib": "the plots"})
    return job


def _progress(line: str) -> None:
    from lockstep.redact import scrub_text

    print(scrub_text(line), file=sys.stderr, flush=True)  # it quotes the job's --set values


def run_record(args: argparse.Namespace) -> int:
    from lockstep.gate import workflows

    g = workflows.record(args.name, _job(args), args.repeats, args.dir, args.workdir, _progress)
    _print_recorded(g)
    return EXIT_OK


def _print_recorded(g) -> None:
    curves = g.header["curves"]
    exact = sorted(m for m, c in curves.items() if c["exact"])
    banded = {m: c["tol_rel"] for m, c in curves.items() if not c["exact"]}
    print(f"lockstep gate: wrote {g.path} ({g.steps.size} steps, {g.header['repeats']} repeats)")
    if exact:
        print(f"  exact (repeats bitwise identical): {', '.join(exact)}")
    for m, tol in sorted(banded.items()):
        print(f"  {m}: band ±{tol:.3g} relative")
    for name, rec in g.header["perf"].items():
        limit = rec["threshold_rel"] if rec["threshold_rel"] is not None else rec["threshold_abs"]
        gated = "" if rec["gated"] else " (not gated: step timing is logged)"
        print(
            f"  {name}: {rec['center']:.6g}, spread {rec['spread_rel']:.1%}, limit {limit:.3g}{gated}"
        )


def run_refresh(args: argparse.Namespace) -> int:
    from lockstep.gate import workflows

    new, old, moves, unreadable = workflows.refresh(
        args.name, _job(args), args.repeats, args.dir, args.workdir, _progress
    )
    _print_recorded(new)
    if unreadable:
        print(f"  it replaced an unreadable golden ({unreadable})")
        return EXIT_OK
    if old is None:
        print("  there was no golden for this environment before")
        return EXIT_OK
    print(
        f"  against the golden it replaced (recorded {old.header.get('created')} at "
        f"{old.header.get('git_revision')}):"
    )
    for m in moves:
        if "perf_change" in m:
            change = m["perf_change"]
            print(f"  {m['metric']}: {'n/a' if change is None else f'{change:+.1%}'}")
        elif "note" in m:
            print(f"  {m['metric']}: {m['note']}")
        else:
            where = f", first at step {m['first_changed_step']}" if m["steps_changed"] else ""
            print(
                f"  {m['metric']}: max abs change {m['max_abs_change']:.6g}, max rel change "
                f"{m['max_rel_change']:.3g}, {m['steps_changed']} of {m['steps_compared']} "
                f"steps changed{where}"
            )
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    from lockstep.gate import workflows

    job = _job(args)
    try:
        result = workflows.check(args.name, job, args.dir, args.workdir, _progress)
    except workflows.NoGolden:
        if args.candidate is not None:
            g = workflows.record(
                args.name, job, args.repeats, args.candidate, args.workdir, _progress
            )
            print(
                f"lockstep gate: candidate golden written to {g.path}: review it and commit "
                f"it as {args.dir / args.name / g.path.name}",
                file=sys.stderr,
            )
        raise
    refresh = f"lockstep gate refresh {args.name} {job.arguments()} --dir {args.dir}"
    title = f"gate {args.name} [{result.golden.env_key}]"
    return _finish(args, result, title, f"gate.{args.name}", result.notes(refresh, job))


def run_compare(args: argparse.Namespace) -> int:
    from lockstep.gate import golden, workflows
    from lockstep.gate.run_result import Run, read_rows

    g = golden.read(args.golden)
    result = workflows.outcome(g, Run(read_rows(args.metrics)), env=None)
    title = f"gate {g.name} [{g.env_key}] vs {args.metrics}"
    return _finish(args, result, title, f"gate.{g.name}", result.notes())


def _finish(args, result, title: str, suite: str, notes: list[str]) -> int:
    from lockstep.gate import report

    report.show(title, result.findings, notes)
    images = []
    if getattr(args, "plot", None):
        from lockstep import extras

        extras.require("lockstep gate --plot", {"matplotlib": "the plots"})
        from lockstep.gate.plot import plot_all

        images = [str(p) for p in plot_all(result.golden, result.run, result.findings, args.plot)]
        print(f"lockstep gate: {len(images)} plots in {args.plot}")
    payload = result.to_dict(notes, images)
    _write_reports(args, title, suite, result.findings, notes, images, payload)
    return EXIT_FAIL if result.failed else EXIT_OK


def _write_reports(args, title, suite, findings, notes, images, payload) -> None:
    from lockstep.gate import report

    if args.json:
        report.to_json(args.json, payload)
    if args.junit:
        report.to_junit(args.junit, f"lockstep.{suite}", findings)
    report.step_summary(report.markdown(title, findings, notes, images))


def run_ab(args: argparse.Namespace) -> int:
    from lockstep.gate import ab, report

    if not 0 < args.alpha < 1 or args.threshold <= 0:
        from lockstep.errors import UsageError

        raise UsageError("--alpha must be in (0, 1) and --threshold above 0")
    comparisons, findings = ab.run_ab(
        _job(args), args.base, args.rounds, args.threshold, args.alpha, args.workdir, _progress
    )
    title = f"gate ab: working tree vs {args.base} ({args.rounds} rounds)"
    report.show(title, findings)
    payload = ab.to_dict(args.base, args.rounds, args.threshold, args.alpha, comparisons, findings)
    _write_reports(args, title, "gate.ab", findings, [], [], payload)
    return EXIT_FAIL if any(f.failed for f in findings) else EXIT_OK


def run_alerts(args: argparse.Namespace) -> int:
    import json

    from lockstep import alerts
    from lockstep.gate.run_result import read_rows

    rules = alerts.load_rules(args.rules)
    fired, unevaluated = alerts.evaluate(rules, read_rows(args.metrics))
    for alert in fired:
        print(f"lockstep: {alert.message()}")
    for rule in unevaluated:
        print(f"lockstep: rule {rule.name} not evaluated: no row has '{rule.metric}'")
    print(f"lockstep: {len(fired)} alerts from {len(rules)} rules over {args.metrics}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "alerts": [a.row() for a in fired],
                    "not_evaluated": [r.name for r in unevaluated],
                },
                indent=1,
            )
            + "\n"
        )
    return EXIT_FAIL if fired else EXIT_OK
