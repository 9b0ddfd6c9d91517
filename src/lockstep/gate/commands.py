"""What each `lockstep gate` subcommand does with its options (`gate.options`): run the job,
print what it found, write the reports. Exit codes: `gate.cli`."""

from __future__ import annotations

import sys
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_NOT_JUDGED, EXIT_OK
from lockstep.gate.options import ABRun, AlertsRun, CompareRun, GateRun, Reports
from lockstep.gate.policy import PERF_JUDGED_REL
from lockstep.inputs import writable
from lockstep.job_options import JobOptions
from lockstep.redact import escape_controls


def _job(options: JobOptions, command: str, reports: Reports):
    from lockstep import extras
    from lockstep.gate.job import Job

    job = Job(
        nproc=options.nproc,
        steps=options.steps,
        config=None if options.config is None else Path(options.config),
        overrides=list(options.overrides),
        command=options.script,
        timeout=options.timeout,
        run_path=options.run_path,
    )
    what = f"lockstep gate {command}"
    job.require_extras(what)  # before any run starts
    if reports.plot:
        extras.require(f"{what} --plot", {"matplotlib": "the plots"})
    return job


def _progress(line: str) -> None:
    from lockstep.redact import scrub_text

    print(scrub_text(line), file=sys.stderr, flush=True)  # it quotes the job's --set values


def record(o: GateRun) -> int:
    """`gate record`: run the job `repeats` times and write its golden."""
    from lockstep.gate import workflows

    job = _job(o.job, o.command, o.reports)
    g = workflows.record(o.name, job, o.repeats, o.dir, o.workdir, _progress)
    _print_recorded(g)
    return EXIT_OK


def _print_recorded(g) -> None:
    curves = g.header["curves"]
    exact = sorted(m for m, c in curves.items() if c["exact"])
    banded = {m: c["tol_rel"] for m, c in curves.items() if not c["exact"]}
    print(f"lockstep gate: wrote {g.path} ({g.steps.size} steps, {g.header['repeats']} repeats)")
    if exact:
        print(f"  exact (repeats bitwise identical): {escape_controls(', '.join(exact))}")
    for m, tol in sorted(banded.items()):
        print(f"  {escape_controls(m)}: band ±{tol:.3g} relative")
    for name, rec in g.header["perf"].items():
        limit = rec["threshold_rel"] if rec["threshold_rel"] is not None else rec["threshold_abs"]
        gated = "" if rec["gated"] else " (not gated: step timing is logged)"
        if rec["gated"] and (rec["threshold_rel"] or 0) > PERF_JUDGED_REL:
            gated = (
                f" (wider than {PERF_JUDGED_REL:.0%}: checks will not judge it; record with "
                "more --repeats on a quieter machine)"
            )
        print(
            f"  {name}: {rec['center']:.6g}, spread {rec['spread_rel']:.1%}, limit {limit:.3g}{gated}"
        )


def refresh(o: GateRun) -> int:
    """`gate refresh`: record anew, and show what moved from the golden it replaces."""
    from lockstep.gate import workflows

    new, old, moves, unreadable = workflows.refresh(
        o.name, _job(o.job, o.command, o.reports), o.repeats, o.dir, o.workdir, _progress
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
            print(
                f"  {escape_controls(m['metric'])}: {'n/a' if change is None else f'{change:+.1%}'}"
            )
        elif "note" in m:
            print(f"  {escape_controls(m['metric'])}: {escape_controls(m['note'])}")
        else:
            where = f", first at step {m['first_changed_step']}" if m["steps_changed"] else ""
            print(
                f"  {escape_controls(m['metric'])}: max abs change {m['max_abs_change']:.6g}, max rel change "
                f"{m['max_rel_change']:.3g}, {m['steps_changed']} of {m['steps_compared']} "
                f"steps changed{where}"
            )
    return EXIT_OK


def check(o: GateRun) -> int:
    """`gate check`: run the job once and compare it with its golden (with `candidate`, record
    one where this environment has none)."""
    from lockstep.gate import workflows

    job = _job(o.job, o.command, o.reports)
    try:
        result = workflows.check(o.name, job, o.dir, o.workdir, _progress)
    except workflows.NoGolden:
        if o.candidate is not None:
            g = workflows.record(o.name, job, o.repeats, o.candidate, o.workdir, _progress)
            print(
                f"lockstep gate: candidate golden written to {g.path}: review it and commit "
                f"it as {o.dir / o.name / g.path.name}",
                file=sys.stderr,
            )
        raise
    refresh = f"lockstep gate refresh {o.name} {job.arguments()} --dir {o.dir}"
    title = f"gate {o.name} [{result.golden.env_key}]"
    return _finish(o.reports, result, title, f"gate.{o.name}", result.notes(refresh, job))


def compare(o: CompareRun) -> int:
    """`gate compare`: a golden file against the metrics.jsonl of a finished run."""
    from lockstep.gate import golden, workflows
    from lockstep.gate.run_result import Run, read_rows

    g = golden.read(o.golden)
    result = workflows.outcome(g, Run(read_rows(o.metrics)), env=None)
    title = f"gate {g.name} [{g.env_key}] vs {o.metrics}"
    return _finish(o.reports, result, title, f"gate.{g.name}", result.notes())


def _finish(reports: Reports, result, title: str, suite: str, notes: list[str]) -> int:
    from lockstep.gate import report

    report.show(title, result.findings, notes)
    images = []
    if reports.plot:
        from lockstep import extras

        extras.require("lockstep gate --plot", {"matplotlib": "the plots"})
        from lockstep.gate.plot import plot_all

        images = [
            str(p) for p in plot_all(result.golden, result.run, result.findings, reports.plot)
        ]
        print(f"lockstep gate: {len(images)} plots in {reports.plot}")
    payload = result.to_dict(notes, images)
    _write_reports(reports, title, suite, result.findings, notes, images, payload)
    return {"fail": EXIT_FAIL, "not_judged": EXIT_NOT_JUDGED}.get(result.verdict, EXIT_OK)


def _write_reports(reports: Reports, title, suite, findings, notes, images, payload) -> None:
    from lockstep.gate import report

    if reports.json:
        report.to_json(reports.json, payload)
    if reports.junit:
        report.to_junit(reports.junit, f"lockstep.{suite}", findings)
    report.step_summary(report.markdown(title, findings, notes, images))


def compare_ab(o: ABRun) -> int:
    """`gate ab`: alternate runs of the base ref and the working tree; judge speed and memory."""
    from lockstep.gate import ab, report

    if not 0 < o.alpha < 1 or o.threshold <= 0:
        from lockstep.errors import UsageError

        raise UsageError("--alpha must be in (0, 1) and --threshold above 0")
    comparisons, findings = ab.run_ab(
        _job(o.job, "ab", o.reports), o.base, o.rounds, o.threshold, o.alpha, o.workdir, _progress
    )
    title = f"gate ab: working tree vs {o.base} ({o.rounds} rounds)"
    report.show(title, findings)
    payload = ab.to_dict(o.base, o.rounds, o.threshold, o.alpha, comparisons, findings)
    _write_reports(o.reports, title, "gate.ab", findings, [], [], payload)
    return {"fail": EXIT_FAIL, "not_judged": EXIT_NOT_JUDGED}.get(ab.verdict(findings), EXIT_OK)


def evaluate_alerts(o: AlertsRun) -> int:
    """`gate alerts`: alert rules (a TOML file, or 'default') over a metrics file."""
    import json

    rules_file, metrics, json_path = o.rules, o.metrics, o.json
    from lockstep import alerts
    from lockstep.gate.run_result import read_rows

    writable(json_path, "--json")
    rules = alerts.load_rules(rules_file)
    fired, unevaluated = alerts.evaluate(rules, read_rows(metrics))
    for alert in fired:
        print(f"lockstep: {escape_controls(alert.message())}")
    for rule in unevaluated:
        print(
            f"lockstep: rule {escape_controls(rule.name)} not evaluated: no row has '{escape_controls(rule.metric)}'"
        )
    print(f"lockstep: {len(fired)} alerts from {len(rules)} rules over {metrics}")
    if json_path:
        json_path.write_text(
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
