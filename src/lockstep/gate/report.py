"""What a gate result looks like to people and to CI: a terminal table, `--json`, `--junit` and
`$GITHUB_STEP_SUMMARY` Markdown, all through `lockstep.redact` (commands and paths may hold
credentials)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from lockstep.gate.compare import Finding
from lockstep.redact import escape_controls, redact_mapping, scrub_text
from lockstep.summary_md import md_cell
from lockstep.summary_md import step_summary as step_summary  # gate.commands's report.step_summary


def rows(findings: list[Finding]) -> list[tuple[str, str, str, str]]:
    return [(f.status, f.gate, f.metric, f.message) for f in findings]


def shown(text: str) -> str:
    """Text for the terminal: secrets redacted, control characters escaped (a metric named
    with terminal escape codes moves no cursor), no rich markup."""
    from rich.markup import escape

    return escape(escape_controls(scrub_text(text)))


def show(title: str, findings: list[Finding], notes: list[str] = ()) -> None:
    from rich.table import Table

    from lockstep.terminal import console as make_console

    console = make_console()
    table = Table(title=shown(title), show_lines=False, expand=False)
    for col in ("", "gate", "metric", "result"):
        table.add_column(col, overflow="fold")
    style = {"pass": "green", "fail": "bold red", "skip": "yellow", "not_judged": "yellow"}
    for status, gate, metric, message in rows(findings):
        table.add_row(f"[{style[status]}]{status}[/]", gate, shown(metric), shown(message))
    console.print(table)
    for note in notes:
        console.print(shown(note))
    for f in findings:
        if f.failed and f.failing:
            listed = ", ".join(
                f"{p['step']}: {p['value']!r} (golden {p['center']!r}, abs {p['abs_err']:.3g}, "
                f"rel {p['rel_err']:.3g})"
                for p in f.failing[:8]
            )
            more = f" … {len(f.failing) - 8} more in --json" if len(f.failing) > 8 else ""
            console.print(shown(f"  {f.metric} new values at failing steps: {listed}{more}"))


def to_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact_mapping(payload), indent=1, default=str) + "\n")


def to_junit(path: Path, suite: str, findings: list[Finding]) -> None:
    """JUnit XML: a test case per (gate, metric); failures carry the message and values."""
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(findings)),
        failures=str(sum(f.failed for f in findings)),
        skipped=str(sum(f.status in ("skip", "not_judged") for f in findings)),
        errors="0",
    )
    for f in findings:
        case = ET.SubElement(ts, "testcase", classname=suite, name=f"{f.gate}:{f.metric}")
        if f.failed:
            node = ET.SubElement(case, "failure", message=scrub_text(f.message))
            node.text = "\n".join(
                f"step {p['step']}: value {p['value']!r} golden {p['center']!r} "
                f"abs_err {p['abs_err']!r} rel_err {p['rel_err']!r}"
                for p in f.failing
            ) or scrub_text(f.message)
        elif f.status in ("skip", "not_judged"):
            ET.SubElement(case, "skipped", message=scrub_text(f.message))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def markdown(
    title: str, findings: list[Finding], notes: list[str] = (), images: list[str] = ()
) -> str:
    icon = {"pass": "✅", "fail": "❌", "skip": "⚠️", "not_judged": "⚠️"}
    failed = sum(f.failed for f in findings)
    unjudged = any(f.status == "not_judged" for f in findings)
    verdict = "FAILED" if failed else "NOT JUDGED" if unjudged else "passed"
    lines = [
        f"### {_md(title)}: {verdict} ({failed} of {len(findings)} gates failed)",
        "",
        "| | gate | metric | result |",
        "|---|---|---|---|",
    ]
    lines += [f"| {icon[s]} | {g} | {_md(m)} | {_md(msg)} |" for s, g, m, msg in rows(findings)]
    lines += ["", *(_md(n) for n in notes)]
    lines += [f"- plot: `{_md(i)}`" for i in images]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return md_cell(scrub_text(str(text)))
