"""Lint rule: no workflow that can reach a self-hosted runner runs on pull request events.

For `pull_request` GitHub runs the workflow file *from the pull request*, so any check inside
it (an `if:` on the fork or a label) is no gate; `pull_request_target` and `workflow_run` run
with the base repository's secrets next to code a fork controls. A workflow "can reach" a
self-hosted runner when a job's `runs-on` names `self-hosted` or a label declared in
.github/actionlint.yaml, is an expression or a runner group (which cannot be told apart), or
calls a local reusable workflow that does. Also: every `uses:` of a remote action or workflow is
pinned by a full 40-hex commit SHA.

    python ci/check-workflows.py [REPO_ROOT]      # exit 1 naming each offence, 0 when clean
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

PR_EVENTS = ("pull_request", "pull_request_target", "workflow_run")
PINNED = re.compile(r"^[^@\s]+@[0-9a-f]{40}$")


def triggers(doc: dict) -> set[str]:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as True
    if isinstance(on, str):
        return {on}
    if isinstance(on, list):
        return set(on)
    return set(on or {})


def runner_labels(runs_on: object) -> list[str] | None:
    """The labels a job asks for; None where they cannot be known statically."""
    if isinstance(runs_on, str):
        return None if "${{" in runs_on else [runs_on]
    if isinstance(runs_on, list) and all(isinstance(x, str) for x in runs_on):
        return None if any("${{" in x for x in runs_on) else list(runs_on)
    return None  # {group: ..., labels: ...}: a runner group may hold self-hosted runners


def check(root: Path) -> list[str]:
    workflows = root / ".github" / "workflows"
    config = root / ".github" / "actionlint.yaml"
    declared = set()
    if config.is_file():
        declared = set(
            (yaml.safe_load(config.read_text()) or {})
            .get("self-hosted-runner", {})
            .get("labels", [])
        )
    docs = {}
    problems = []
    for path in sorted([*workflows.glob("*.yml"), *workflows.glob("*.yaml")]):
        try:
            docs[path] = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            problems.append(f"{path.relative_to(root)}: not YAML ({err})")

    def reaches_self_hosted(path: Path, seen: frozenset = frozenset()) -> str | None:
        for name, job in (docs.get(path, {}).get("jobs") or {}).items():
            uses = job.get("uses", "")
            if uses.startswith("./"):
                callee = root / uses
                if callee not in seen:
                    why = reaches_self_hosted(callee, seen | {path})
                    if why:
                        return f"job {name} calls {uses}, where {why}"
                continue
            if "runs-on" not in job:
                continue
            labels = runner_labels(job["runs-on"])
            if labels is None:
                return f"job {name} has runs-on {job['runs-on']!r}, which may be self-hosted"
            hosted = {"self-hosted", *declared} & set(labels)
            if hosted:
                return f"job {name} runs on {', '.join(sorted(hosted))}"
        return None

    for path, doc in docs.items():
        rel = path.relative_to(root)
        events = triggers(doc) & set(PR_EVENTS)
        why = reaches_self_hosted(path)
        if events and why:
            problems.append(
                f"{rel}: {why} and it triggers on {', '.join(sorted(events))}; self-hosted "
                "runners take main's definitions only (push, workflow_dispatch): "
                "see docs/gpu-runners.md"
            )
        for name, job in (doc.get("jobs") or {}).items():
            steps = job.get("steps") or []
            refs = [job.get("uses")] + [s.get("uses") for s in steps if isinstance(s, dict)]
            for ref in refs:
                if ref and not ref.startswith(("./", "docker://")) and not PINNED.match(ref):
                    problems.append(f"{rel}: job {name} uses {ref}: pin it by a full commit SHA")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1])
    if not (root / ".github" / "workflows").is_dir():
        print(f"check-workflows: error: no .github/workflows under {root}", file=sys.stderr)
        return 2
    problems = check(root)
    for line in problems:
        print(f"check-workflows: {line}", file=sys.stderr)
    if not problems:
        print(f"check-workflows: {root / '.github/workflows'}: no self-hosted job on a PR event")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
