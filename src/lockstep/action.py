"""The GitHub Action's step (action.yml): one lockstep command from the action's inputs, its
verdict under the action's NOT JUDGED policy, the job summary and the step's outputs. Inputs
arrive as `INPUT_*` variables, never spliced into shell. Design: docs/design/action.md."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_NOT_JUDGED, EXIT_OK, EXIT_USAGE, UsageError
from lockstep.redact import escape_controls, scrub_text

COMMANDS = ("check", "gate check", "gate record", "gate ab", "preflight")
VERDICTS = {EXIT_OK: "pass", EXIT_FAIL: "fail", EXIT_NOT_JUDGED: "not-judged"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Inputs:
    command: str
    check: str = "all"
    script: str = ""
    config: str = ""
    nproc: str = "2"
    steps: str = ""
    gate: str = ""
    gates_dir: str = "gates"
    base: str = ""
    allow_not_judged: tuple[str, ...] = ()
    args: str = ""

    @classmethod
    def from_environ(cls, environ) -> Inputs:
        def get(name: str, default: str = "") -> str:
            return environ.get("INPUT_" + name.upper().replace("-", "_"), default).strip()

        allow = tuple(n.strip() for n in get("allow-not-judged").split(",") if n.strip())
        inputs = cls(
            command=" ".join(get("command", "check").split()),
            check=get("check") or "all",
            script=get("script"),
            config=get("config"),
            nproc=get("nproc") or "2",
            steps=get("steps"),
            gate=get("gate"),
            gates_dir=get("gates-dir") or "gates",
            base=get("base"),
            allow_not_judged=allow,
            args=get("args"),
        )
        inputs.validate()
        return inputs

    def validate(self) -> None:
        if self.command not in COMMANDS:
            raise UsageError(f"input command {self.command!r}: one of {', '.join(COMMANDS)}")
        if self.command != "preflight" and bool(self.script) == bool(self.config):
            raise UsageError(f"{self.command} needs the input script or config (exactly one)")
        if self.command in ("gate check", "gate record") and not NAME.match(self.gate):
            raise UsageError(f"{self.command} needs the input gate: the gate's name")
        if self.command == "gate ab" and not self.base:
            raise UsageError("gate ab needs the input base: the git ref to compare with")


def argv(inputs: Inputs, folder: Path) -> list[str]:
    """The lockstep command line of these inputs, its reports and runs under `folder`."""
    job = ["--script", inputs.script] if inputs.script else [inputs.config]
    job += ["--nproc", inputs.nproc] + (["--steps", inputs.steps] if inputs.steps else [])
    report = ["--json", str(folder / "report.json")]
    junit = ["--junit", str(folder / "junit.xml")]
    runs = str(folder / "runs")
    if inputs.command == "check":
        out = ["check", inputs.check, *job, "--out", runs, *report]
    elif inputs.command == "gate check":
        out = ["gate", "check", inputs.gate, *job, "--dir", inputs.gates_dir, "--workdir", runs]
        out += [*report, *junit, "--candidate", str(folder / "candidate")]
    elif inputs.command == "gate record":
        out = ["gate", "record", inputs.gate, *job, "--dir", str(folder / "candidate")]
        out += ["--workdir", runs]
    elif inputs.command == "gate ab":
        out = ["gate", "ab", *job, "--base", inputs.base, "--workdir", runs, *report, *junit]
    else:
        out = ["preflight", "--nproc", inputs.nproc, *report]
    return out + shlex.split(inputs.args)


def not_judged(report: Path, command: str) -> list[tuple[str, str]]:
    """(name, why) of each part the report leaves not judged: a check, or a gate's metric."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return [(command, "no report was written")]
    if isinstance(data, list):  # `check`: one result a check
        return [(r["name"], r.get("summary", "")) for r in data if r.get("verdict") == "not_judged"]
    found = [f for f in data.get("findings") or [] if f.get("status") == "not_judged"]
    return [(command, f"{f.get('metric')}: {f.get('message')}") for f in found] or [
        (command, "; ".join(map(str, data.get("notes") or [])) or "not judged")
    ]


def verdict(code: int, parts: list[tuple[str, str]], allowed: tuple[str, ...]) -> tuple[str, int]:
    """The step's verdict and exit code: a NOT JUDGED fails unless every part not judged was
    allowed by name, and then it is a warning, never a pass."""
    if code != EXIT_NOT_JUDGED:
        return VERDICTS.get(code, "error"), code
    if parts and all(name in allowed for name, _ in parts):
        return "not-judged", EXIT_OK
    return "not-judged", EXIT_NOT_JUDGED


def summary(inputs: Inputs, line: list[str], state: str, code: int, parts, candidate) -> str:
    shown = scrub_text(shlex.join(["lockstep", *line]))
    text = [f"### lockstep {inputs.command}: {state.upper()}", "", f"`{shown}` (exit {code})"]
    for name, why in parts:
        allowed = " (allowed: a warning)" if name in inputs.allow_not_judged else ""
        text.append(f"- NOT JUDGED {escape_controls(name)}{allowed}: {scrub_text(why)}")
    if candidate is not None:
        run = os.environ.get("GITHUB_RUN_ID", "RUN_ID")
        text += [
            "",
            f"A candidate golden for this runner is in the artifact `lockstep-golden` "
            f"({candidate.name}/): review it, then commit it from a checkout of this branch:",
            "",
            "```bash",
            f"gh run download {run} -n lockstep-golden -D {inputs.gates_dir}",
            f"git add {inputs.gates_dir} && git commit -m 'gate {inputs.gate}: golden for this runner'",
            "```",
        ]
    return "\n".join(text) + "\n"


def main(environ=os.environ) -> int:
    try:
        inputs = Inputs.from_environ(environ)
    except UsageError as err:
        print(f"::error::lockstep action: {escape_controls(str(err))}")
        return EXIT_USAGE
    folder = Path(environ.get("RUNNER_TEMP") or ".") / "lockstep"
    folder.mkdir(parents=True, exist_ok=True)
    line = argv(inputs, folder)
    code = subprocess.run([sys.executable, "-m", "lockstep", *line], check=False).returncode
    parts = not_judged(folder / "report.json", inputs.command) if code == EXIT_NOT_JUDGED else []
    state, exit_code = verdict(code, parts, inputs.allow_not_judged)
    candidate = folder / "candidate"
    candidate = candidate if candidate.is_dir() and any(candidate.rglob("*.json")) else None
    if state == "not-judged" and exit_code == EXIT_OK:
        print("::warning::lockstep: NOT JUDGED, allowed by allow-not-judged; nothing was passed")
    _append(environ.get("GITHUB_STEP_SUMMARY"),
            summary(inputs, line, state, code, parts, candidate))  # fmt: skip
    outputs = {
        "verdict": state,
        "exit-code": str(code),
        "report": str(folder / "report.json") if (folder / "report.json").exists() else "",
        "junit": str(folder / "junit.xml") if (folder / "junit.xml").exists() else "",
        "runs": str(folder / "runs") if (folder / "runs").exists() else "",
        "candidate": str(candidate) if candidate else "",
    }
    _append(environ.get("GITHUB_OUTPUT"), "".join(f"{k}={v}\n" for k, v in outputs.items()))
    return exit_code


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
