"""A composite action's steps run in order as a GitHub runner runs them, without GitHub: inputs
as GitHub passes them (declared defaults, strings), the variables it sets (GITHUB_OUTPUT,
GITHUB_STEP_SUMMARY, RUNNER_TEMP, GITHUB_ACTION_PATH, ...), `${{ }}` expressions and `if:`
conditions. An expression, context, function or `uses:` it does not implement is an error, so
that the test cannot pass over a step it did not run as GitHub would.

Implemented `uses:`: actions/setup-python (only when its `if:` is false: no Python is set up
here) and actions/upload-artifact (files copied into ARTIFACTS/NAME/).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<name>[A-Za-z_][\w.-]*))"
)


class Unimplemented(AssertionError):
    """The action uses what this runner does not implement."""


@dataclass
class Result:
    outcomes: dict[str, str] = field(default_factory=dict)  # step id or index -> outcome
    outputs: dict[str, str] = field(default_factory=dict)  # the action's outputs
    summary: str = ""
    artifacts: Path | None = None
    failed: bool = False
    log: str = ""


class Runner:
    def __init__(self, action_dir: Path, workspace: Path, temp: Path, environ: dict[str, str]):
        self.action_dir, self.workspace, self.temp = action_dir, workspace, temp
        self.action = yaml.safe_load((action_dir / "action.yml").read_text())
        if self.action["runs"]["using"] != "composite":
            raise Unimplemented("only composite actions")
        self.environ = environ
        self.artifacts = temp / "artifacts"

    # ---------------------------------------------------------------- expressions

    def evaluate(self, text: str, context: dict) -> object:
        tokens = []
        pos = 0
        while pos < len(text.rstrip()):
            m = TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise Unimplemented(f"expression {text!r} at {text[pos:]!r}")
            tokens.append(m)
            pos = m.end()
        value, rest = self._or(tokens, context)
        if rest:
            raise Unimplemented(f"expression {text!r}: trailing {rest[0].group(0)!r}")
        return value

    def _or(self, tokens, ctx):
        left, tokens = self._and(tokens, ctx)
        while tokens and tokens[0].group("op") == "||":
            right, tokens = self._and(tokens[1:], ctx)
            left = left or right
        return left, tokens

    def _and(self, tokens, ctx):
        left, tokens = self._cmp(tokens, ctx)
        while tokens and tokens[0].group("op") == "&&":
            right, tokens = self._cmp(tokens[1:], ctx)
            left = left and right
        return left, tokens

    def _cmp(self, tokens, ctx):
        left, tokens = self._unary(tokens, ctx)
        if tokens and tokens[0].group("op") in ("==", "!="):
            op = tokens[0].group("op")
            right, tokens = self._unary(tokens[1:], ctx)
            same = str(left).lower() == str(right).lower()  # GitHub compares strings case-blind
            left = same if op == "==" else not same
        return left, tokens

    def _unary(self, tokens, ctx):
        if not tokens:
            raise Unimplemented("expression ends early")
        head = tokens[0]
        if head.group("op") == "!":
            value, rest = self._unary(tokens[1:], ctx)
            return not value, rest
        if head.group("op") == "(":
            value, rest = self._or(tokens[1:], ctx)
            if not rest or rest[0].group("op") != ")":
                raise Unimplemented("unbalanced parenthesis")
            return value, rest[1:]
        if head.group("str"):
            return head.group("str")[1:-1].replace("''", "'"), tokens[1:]
        name = head.group("name")
        if name is None:
            raise Unimplemented(f"unexpected {head.group(0)!r}")
        rest = tokens[1:]
        if rest and rest[0].group("op") == "(":
            if len(rest) < 2 or rest[1].group("op") != ")":
                raise Unimplemented(f"function {name} with arguments")
            functions = {"always": True, "success": not ctx["failed"], "failure": ctx["failed"]}
            if name not in functions:
                raise Unimplemented(f"function {name}()")
            return functions[name], rest[2:]
        return self._lookup(name, ctx), rest

    def _lookup(self, name: str, ctx: dict) -> object:
        parts = name.split(".")
        if parts[0] not in ("inputs", "github", "runner", "steps", "strategy", "env"):
            raise Unimplemented(f"context {parts[0]}")
        value: object = ctx
        for part in parts:
            if value == "" and parts[0] == "steps":
                return ""  # a step that did not run: its outputs are null, as on GitHub
            if not isinstance(value, dict):
                raise Unimplemented(f"{name}")
            if parts[0] in ("github", "runner", "strategy") and part not in value:
                raise Unimplemented(f"{name} is not set by this runner")
            value = value.get(part, "")
        return value

    def substitute(self, text: str, ctx: dict) -> str:
        return EXPRESSION.sub(lambda m: _string(self.evaluate(m.group(1), ctx)), text)

    # ---------------------------------------------------------------- steps

    def run(self, inputs: dict[str, str], job: str = "check") -> Result:
        declared = self.action.get("inputs") or {}
        unknown = set(inputs) - set(declared)
        if unknown:
            raise Unimplemented(f"inputs the action does not declare: {sorted(unknown)}")
        values = {k: str(inputs.get(k, spec.get("default", ""))) for k, spec in declared.items()}
        self.temp.mkdir(parents=True, exist_ok=True)
        output_files, summary = self.temp / "outputs", self.temp / "summary.md"
        output_files.mkdir(exist_ok=True)
        summary.touch()
        ctx: dict = {
            "inputs": values,
            "github": {
                "action_path": str(self.action_dir),
                "job": job,
                "run_id": "1234",
                "workspace": str(self.workspace),
            },
            "runner": {"temp": str(self.temp), "os": "Linux"},
            "strategy": {"job-index": "0"},
            "steps": {},
            "env": {},
            "failed": False,
        }
        result = Result(artifacts=self.artifacts)
        logs = []
        for index, step in enumerate(self.action["runs"]["steps"]):
            key = step.get("id", str(index))
            condition = step.get("if", "success()")
            condition = EXPRESSION.sub(lambda m: m.group(1), str(condition))
            if "always()" not in condition and "failure()" not in condition:
                condition = f"success() && ({condition})"
            if not self.evaluate(condition, ctx):
                result.outcomes[key] = "skipped"
                continue
            env = {k: self.substitute(str(v), ctx) for k, v in (step.get("env") or {}).items()}
            if "uses" in step:
                ok = self._uses(step, ctx)
                outputs: dict[str, str] = {}
            else:
                out_file = output_files / f"{key}.txt"
                out_file.write_text("")
                if step.get("shell") != "bash":
                    raise Unimplemented(f"step {key}: shell {step.get('shell')!r}")
                script = self.substitute(step["run"], ctx)
                proc = subprocess.run(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                    cwd=self.workspace,
                    env={**self.environ, "GITHUB_OUTPUT": str(out_file),
                         "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTION_PATH":
                         str(self.action_dir), "GITHUB_WORKSPACE": str(self.workspace),
                         "GITHUB_RUN_ID": "1234", "GITHUB_JOB": job, "RUNNER_TEMP":
                         str(self.temp), "GITHUB_ACTIONS": "true", "CI": "true", **env},
                    capture_output=True, text=True, timeout=1200,
                )  # fmt: skip
                logs.append(f"--- step {key}\n{proc.stdout}{proc.stderr}")
                ok = proc.returncode == 0
                outputs = _read_outputs(out_file.read_text())
            ctx["steps"][key] = {"outputs": outputs, "outcome": "success" if ok else "failure"}
            result.outcomes[key] = "success" if ok else "failure"
            if not ok:
                ctx["failed"] = True
        for name, spec in (self.action.get("outputs") or {}).items():
            result.outputs[name] = self.substitute(str(spec["value"]), ctx)
        result.summary = summary.read_text()
        result.failed = ctx["failed"]
        result.log = "\n".join(logs)
        return result

    def _uses(self, step: dict, ctx: dict) -> bool:
        action, _, ref = step["uses"].partition("@")
        if not re.fullmatch(r"[0-9a-f]{40}", ref):
            raise Unimplemented(f"{step['uses']}: not pinned by a commit SHA")
        args = {k: self.substitute(str(v), ctx) for k, v in (step.get("with") or {}).items()}
        if action == "actions/upload-artifact":
            target = self.artifacts / args["name"]
            if target.exists():
                raise Unimplemented(f"artifact {args['name']} uploaded twice in one job")
            lines = [p.strip() for p in args["path"].splitlines() if p.strip()]
            excluded = [Path(p[1:]) for p in lines if p.startswith("!")]
            for line in (p for p in lines if not p.startswith("!")):
                source = Path(line)
                if not source.exists():
                    continue
                files = [source] if source.is_file() else sorted(source.rglob("*"))
                for f in files:
                    if f.is_file() and not any(f.is_relative_to(x) for x in excluded):
                        rel = f.name if source.is_file() else f.relative_to(source)
                        (target / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(f, target / rel)
            return True
        raise Unimplemented(f"uses: {action}")


def _string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _read_outputs(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT's two forms: `name=value` and `name<<DELIMITER` ... `DELIMITER`."""
    out, lines = {}, iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body = []
            for inner in lines:
                if inner == delimiter:
                    break
                body.append(inner)
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def environ_for(venv_bin: Path) -> dict[str, str]:
    """A job's environment whose `python` is `venv_bin`'s."""
    keep = ("HOME", "LANG", "TMPDIR", "OMP_NUM_THREADS")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = f"{venv_bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    return env
