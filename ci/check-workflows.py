"""Lint rules: fork code reaches neither the self-hosted runners nor a token, nor picks an image.

1. No workflow that can reach a self-hosted runner runs on pull request events.

For `pull_request` GitHub runs the workflow file *from the pull request*, so any check inside
it (an `if:` on the fork or a label) is no gate; `pull_request_target` and `workflow_run` run
with the base repository's secrets next to code a fork controls. A workflow "can reach" a
self-hosted runner when a job's `runs-on` names `self-hosted` or a label declared in
.github/actionlint.yaml, is an expression or a runner group (which cannot be told apart), or
calls a local reusable workflow that does.
2. Every `uses:` of a remote action or workflow is pinned by a full 40-hex commit SHA.
3. Code of the commit under test never runs beside a token, and never decides an image. A
checkout whose `ref:` is an expression (other than github.sha / github.ref) or another
repository fetches code someone else chose: a pull request's head, dispatched for a GPU run.
After such a checkout in a job, no step that holds a token (`secrets.*`, `github.token`) may run
its files; none may source its files (`source`, `.`, `<(...)`); into the workspace root (no
`path:`) every later step counts as running it. A job whose outputs choose another job's
`container` or `services` image must check such code out under a `path:` and read it as data
with the workflow's own scripts. (The shape that gpu.yml had: the pull request's head checked
out at the root, then `source <(docker/build-args.sh)` with GH_TOKEN, deciding the GPU image.)

    python ci/check-workflows.py [REPO_ROOT]      # exit 1 naming each offence, 0 when clean
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

PR_EVENTS = ("pull_request", "pull_request_target", "workflow_run")
PINNED = re.compile(r"^[^@\s]+@[0-9a-f]{40}$")
TOKEN = re.compile(r"\$\{\{\s*(?:secrets\.|github\.token\b)")
TRUSTED_REFS = {"${{ github.sha }}", "${{ github.ref }}", "main", "refs/heads/main"}
# Shell that includes a file into the running shell: `source f`, `. f`, `source <(cmd)`.
SOURCES = re.compile(r"(?:^|[\s;&|({])(?:source|\.)\s+(?:<\(|[^\s;&|]+)", re.MULTILINE)
# Commands that run a file named after them (interpreters, or the file itself: ./x, dir/x.sh).
RUNNERS = r"(?:source|\.|bash|sh|zsh|exec|python3?|node|perl|ruby|make\s+-f|nox\s+-f)"


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


def untrusted_checkout(step: dict) -> str | None:
    """The `path:` (`""` for the root) of a checkout of code chosen elsewhere; None if none."""
    if not isinstance(step, dict) or not str(step.get("uses", "")).startswith("actions/checkout@"):
        return None
    options = step.get("with") or {}
    ref = str(options.get("ref", "")).strip()
    if "repository" in options or (ref and ref not in TRUSTED_REFS):
        return str(options.get("path", "")).strip().strip("/")
    return None


def runs_files_from(text: str, path: str) -> bool:
    """Does this shell run or source a file under `path/` (as a command, or an interpreter's)?"""
    under = rf"[\"']?(?:\./)?{re.escape(path)}/"
    command = r"(?:^|[;&|(]|&&|\|\|)\s*"
    return bool(
        re.search(rf"{command}(?:{RUNNERS}\s+(?:-\S+\s+)*)?{under}", text, re.MULTILINE)
        or re.search(rf"<\(\s*{under}", text)
    )


def untrusted_code_offences(name: str, job: dict, decides_image: bool) -> list[str]:
    """Rule 3 for one job."""
    problems = []
    paths: list[str] = []
    for index, step in enumerate(job.get("steps") or [], 1):
        if not isinstance(step, dict):
            continue
        label = f"job {name} step {step.get('name') or step.get('uses') or index}"
        path = untrusted_checkout(step)
        if path is not None:
            paths.append(path)
            if path == "" and decides_image:
                problems.append(
                    f"{label}: checks out code chosen elsewhere into the workspace root in a job "
                    "whose output picks an image; check it out under a path: and read it as data"
                )
            continue
        if not paths:
            continue
        run = str(step.get("run", ""))
        token = bool(TOKEN.search(str(step.get("env", "")) + str(step.get("with", "")) + run))
        at_root = "" in paths
        runs = at_root or any(runs_files_from(run, p) for p in paths if p)
        sources = SOURCES.search(run) and (
            at_root or any(re.search(re.escape(p) + "/", run) for p in paths if p)
        )
        if sources:
            problems.append(
                f"{label}: sources files of a checkout chosen elsewhere (a pull request's); read "
                "them as data with a strict KEY=VALUE reader (ci/gpu-image.py)"
            )
        if token and runs:
            problems.append(
                f"{label}: holds a token where code of a checkout chosen elsewhere runs; run only "
                "the workflow's own scripts in a step with a token"
            )
    return problems


def image_deciders(doc: dict) -> set[str]:
    """Jobs whose outputs choose another job's container or service image."""
    deciders = set()
    for job in (doc.get("jobs") or {}).values():
        if not isinstance(job, dict):
            continue
        images = [job.get("container")]
        images += [s for s in (job.get("services") or {}).values()]
        text = " ".join(str(i.get("image") if isinstance(i, dict) else i) for i in images if i)
        deciders.update(re.findall(r"needs\.([A-Za-z0-9_-]+)\.outputs\.", text))
    return deciders


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
        deciders = image_deciders(doc)
        for name, job in (doc.get("jobs") or {}).items():
            for line in untrusted_code_offences(name, job, name in deciders):
                problems.append(f"{rel}: {line}")
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
        print(
            f"check-workflows: {root / '.github/workflows'}: no self-hosted job on a PR event, "
            "every action pinned, no token or image choice beside code checked out from elsewhere"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
