"""`lockstep check` below its parser: run what `request` asks (`plans.run`), show each result as
it comes, then write the step summary and the --json report; the exit code."""

from __future__ import annotations

import json

from lockstep.checks import plans
from lockstep.checks.result import exit_code


def check(request: plans.Request) -> int:
    from lockstep.inputs import writable

    json_path = request.json
    writable(json_path, "--json")  # before the runs, not after them
    outcome = plans.run(request, show)
    if not outcome.passed:
        print(f"runs and logs: {outcome.workdir}")
    from lockstep.checks.divergence import markdown
    from lockstep.redact import scrub_text
    from lockstep.summary_md import step_summary

    if section := markdown(outcome.results):
        step_summary(scrub_text(section))
    if json_path:
        from lockstep.redact import redact_mapping

        report = [redact_mapping(r.to_dict()) for r in outcome.results]
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    return exit_code(outcome.results)


def show(result) -> None:
    """One result, as it comes: PASS, FAIL or NOT JUDGED, its summary, a likely cause, forensics."""
    from rich.markup import escape

    from lockstep.redact import scrub_text
    from lockstep.terminal import console as make_console

    console = make_console()
    mark = {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]"}.get(
        result.verdict, "[yellow]NOT JUDGED[/yellow]"
    )
    # the summary may hold paths and values with brackets: never markup
    summary = escape(scrub_text(result.summary))
    console.print(f"{mark} {escape(result.name)}: {summary}", markup=True)
    if result.diagnosis and result.verdict == "fail":
        console.print(f"     likely cause: {scrub_text(result.diagnosis)}", markup=False)
    for line in (result.forensics or {}).get("lines", ()):
        console.print(f"     {scrub_text(line)}", markup=False)
