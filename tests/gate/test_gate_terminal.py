"""What the gate prints is text: a metric or alert named with terminal escape codes or a newline
is shown escaped, never moving the cursor or forging a line (issue #37)."""

from __future__ import annotations

import json

from lockstep.gate.compare import Finding
from lockstep.gate.report import show
from support.inprocess import run_main

FORGED = "loss\x1b[2J\x1b[31m\nPASS: all good"


def test_a_finding_named_with_escape_codes_is_shown_escaped(capsys):
    show("gate", [Finding("curve", FORGED, "fail", f"{FORGED} moved", failing=[
        {"step": 1, "value": 2.0, "center": 1.0, "abs_err": 1.0, "rel_err": 1.0}])])  # fmt: skip
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J" in out
    assert "\nPASS: all good" not in out


def test_an_alert_on_a_metric_named_with_escape_codes_is_shown_escaped(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[[rule]]\nname = "nan"\nmetric = {json.dumps(FORGED)}\nwhen = "nonfinite"\n')
    (tmp_path / "m.jsonl").write_text(json.dumps({"step": 1, FORGED: float("nan")}) + "\n")
    result = run_main(["gate", "alerts", str(rules), "m.jsonl"], tmp_path)
    assert "\x1b" not in result.stdout and "\\x1b[2J" in result.stdout, (
        result.stdout + result.stderr
    )
