"""Lint rules: fork code reaches neither the self-hosted runners nor a token, nor picks an image.

1. A workflow that can reach a self-hosted runner starts only on what a maintainer starts with
main's definitions: `push`, `schedule`, `workflow_dispatch` (or `workflow_call` from such a
workflow). Everything else is refused: for `pull_request`, `pull_request_review` and
`pull_request_review_comment` GitHub runs the workflow file *from the pull request*, so any check
inside it (an `if:` on the fork or a label) is no gate; `pull_request_target` and `workflow_run`
run with the base repository's secrets next to code a fork controls; `issue_comment`, `issues`,
`discussion*`, `fork`, `watch`, `check_*`, `status` can be started by anyone; `merge_group`
runs a pull request's code. A workflow "can reach" a self-hosted runner when a job's `runs-on`
names `self-hosted` or a label declared in .github/actionlint.yaml (case-blind, as GitHub
matches labels), is an expression or a runner group (which cannot be told apart), or calls a
remote reusable workflow or a local one that does.
2. Every `uses:` of a remote action or workflow is pinned by a full 40-hex commit SHA.
3. Code of the commit under test never runs beside a token, and never decides an image. A checkout
whose `ref:` is an expression (other than github.sha / github.ref) or another repository fetches
code someone else chose: a pull request's head, dispatched for a GPU run (a called workflow's own
`repository: ${{ job.workflow_repository }}` at `ref: ${{ job.workflow_sha }}` is not: it is the
definition's code); so does `gh pr checkout`,
`git fetch ... pull/...` or a `git checkout` of a variable in a step (taken as the workspace root),
and `actions/download-artifact` of another run (`run-id:`, or in a `workflow_run` workflow, whose
triggering run may be a pull request's). Such a checkout keeps no credentials
(`persist-credentials: false` on every checkout of the job). A step *runs* the checkout's code when
it: runs in it (`working-directory:`, job or workflow `defaults`, `cd`/`pushd`); names one of its
paths in any command other than a data reader (`cat`, `cmp`, `sha256sum`, `grep`, `jq`, ... or an
interpreter given a script from outside it: `python3 -I main/ci/x.py pr`), so `pip install -e pr`,
`make -C pr`, `pr/build.sh`, `cat pr/x | sh` all run it; writes its data into `$GITHUB_ENV` or
`$GITHUB_PATH`; or uses a local action from it. Into the workspace root (no `path:`) every later
step runs it, and after a step that runs it every later step counts as running it too (it could
rewrite any file or the environment). No step that runs it may hold a token: `secrets.*` or
`github.token` in the workflow's, the job's, the container's or the step's `env`, in `with:` or
`run:`, or `id-token: write` (the OIDC token is in every step's environment). No step may source
its files (`source`, `.`, `<(...)`). A job whose outputs choose another job's `container` or
`services` image checks such code out under a `path:` and never runs it: it reads it as data with
the workflow's own scripts. (The shape that gpu.yml had: the pull request's head checked out at the
root, then `source <(docker/build-args.sh)` with GH_TOKEN, deciding the GPU image.)

Each offence is one line naming the file, the job and the step. The shell is read by patterns,
not parsed: a command it cannot split into words counts as running the code, but what flows
through a variable or a file it writes (`cat pr/x >f; bash f`) is not followed, nor the `token`
inputs that actions default to `github.token`.

    python ci/check-workflows.py [REPO_ROOT]      # exit 1 naming each offence, 0 when clean
"""

from __future__ import annotations

import posixpath
import re
import shlex
import sys
from pathlib import Path

import yaml

# The events a maintainer starts, with main's definition (workflow_call: its callers are checked).
MAINTAINER_EVENTS = ("push", "schedule", "workflow_dispatch", "workflow_call")
PINNED = re.compile(r"^[^@\s]+@[0-9a-f]{40}$")
TOKEN = re.compile(r"\$\{\{[^}]*?(?<![\w.])(?:secrets\b|github\.token\b)")
TRUSTED_REFS = {"${{ github.sha }}", "${{ github.ref }}", "main", "refs/heads/main"}
# A called workflow's own repository at its own commit (what GitHub resolved for the caller's
# `uses:`): the code its definition came from, as trusted as github.sha is for a workflow.
OWN_CHECKOUT = ("${{job.workflow_repository}}", "${{job.workflow_sha}}")
# Shell that includes a file into the running shell: `source f`, `. f`, `source <(cmd)`.
SOURCES = re.compile(r"(?:^|[\s;&|({])(?:source|\.)\s+(?:<\(|[^\s;&|]+)", re.MULTILINE)
# Shell that fetches code chosen elsewhere into the working folder.
RUN_CHECKOUT = re.compile(
    r"\bgh\s+pr\s+checkout\b|\bgit\s+fetch\b[^\n;&|]*\bpull/|"
    r"\bgit\s+(?:checkout|switch|reset|merge|pull|worktree\s+add)\b[^\n;&|]*(?:\$|EXPR)"
)
# Commands that read a file as data and run nothing of it.
READERS = frozenset(
    re.split(
        r"\s+",
        "cat cmp diff sha256sum sha512sum sha1sum md5sum b2sum wc head tail grep egrep fgrep jq "
        "test [ [[ ls stat du echo printf cut sort uniq tr comm base64 od xxd true :",
    )
)
# Variables that change what a later command runs or loads.
LOADERS = re.compile(
    r"\w*PATH|LD_\w+|BASH_ENV|ENV|PYTHON\w+|NODE_\w+|PERL\w+|RUBY\w+|GIT_\w+|HOME|XDG_\w+|"
    r"\w*OPTIONS|\w*OPTS?|PIP_\w+|UV_\w+|NPM_\w+|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|IFS"
)
KEYWORDS = frozenset(re.split(r"\s+", "! { } then do else elif if while until time fi done"))
INTERPRETER = re.compile(r"python(?:3(?:\.\d+)?)?|bash|sh|dash|zsh|node|perl|ruby")
# The workspace root, spelt as a variable: it stands for `.` when paths are compared.
WORKSPACE = re.compile(
    r"\$\{\{\s*github\.workspace\s*\}\}|\$\{?GITHUB_WORKSPACE\}?|\$\{?PWD\}?|\$\(pwd\)"
)
# A command or process substitution with no other inside it; DATA stands for its output.
SUBSTITUTION = re.compile(r"\$\(([^()`]*)\)|`([^`]*)`|[<>]\(([^()`]*)\)")
DATA = "CHECKOUT_DATA"
# Where one command of a pipeline list ends (a pipe joins stages of one unit).
UNIT_END = re.compile(r"\n|;|&&|\|\||\$\(|`|<\(|>\(|\(|\)|(?<![>&|])&(?![>&])")


def triggers(doc: dict) -> set[str]:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as True
    if isinstance(on, str):
        return {on}
    if isinstance(on, list):
        return {str(x) for x in on}
    return {str(x) for x in on} if isinstance(on, dict) else set()


def runner_labels(runs_on: object) -> list[str] | None:
    """The labels a job asks for, lower-case; None where they cannot be known statically."""
    if isinstance(runs_on, str):
        runs_on = [runs_on]
    if isinstance(runs_on, list) and all(isinstance(x, str) for x in runs_on):
        return None if any("${{" in x for x in runs_on) else [x.lower() for x in runs_on]
    return None  # {group: ..., labels: ...}: a runner group may hold self-hosted runners


def untrusted_checkout(step: dict, cross_run: bool = False) -> str | None:
    """The `path:` (`""` for the root) of a checkout of code chosen elsewhere; None if none.

    An artifact of another run counts as one (`run-id:`, or any download in a workflow_run
    workflow: the run that made it may be a pull request's)."""
    options = step.get("with") if isinstance(step.get("with"), dict) else {}
    if str(step.get("uses", "")).lower().startswith("actions/download-artifact@"):
        if cross_run or "run-id" in options or "github-token" in options:
            return folder(str(options.get("path", "")))
        return None
    if not is_checkout(step):
        return None
    ref = str(options.get("ref", "")).strip()
    own = tuple(re.sub(r"\s", "", str(options.get(k, ""))) for k in ("repository", "ref"))
    if own == OWN_CHECKOUT:
        return None
    if "repository" in options or (ref and ref not in TRUSTED_REFS):
        return folder(str(options.get("path", "")))
    return None


def is_checkout(step: dict) -> bool:
    return str(step.get("uses", "")).lower().startswith("actions/checkout@")


def folder(path: str) -> str:
    """A workspace-relative folder as the shell would name it: "" for the root, or unknown."""
    path = WORKSPACE.sub(".", path.strip())
    if "${{" in path or "$" in path:
        return ""  # cannot be known: count it as the root
    path = posixpath.normpath(path).strip("/")
    return "" if path in (".", "") else path


def mentions(path: str) -> re.Pattern:
    """A word of the shell that names `path` or a file under it (`-Ipath` too)."""
    return re.compile(
        rf"(?:^|(?<=[\s\"'=:<>,])|(?<=\s-[A-Za-z]))(?:\.\.?/)*{re.escape(path)}(?![\w.-])",
        re.MULTILINE,
    )


def normalised(run: str) -> str:
    """The shell with line continuations joined, the workspace as `.`, expressions as EXPR."""
    run = WORKSPACE.sub(".", run.replace("\\\n", " "))
    run = re.sub(r"\$\{\{.*?\}\}", "EXPR", run)
    run = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}", r"$\1", run)
    return re.sub(r"^\s*#.*$", "", run, flags=re.MULTILINE)


def stage_runs(stage: str, named: list[re.Pattern]) -> bool:
    """Does this command (one stage of a pipeline that names the checkout) run its code?"""
    try:
        words = shlex.split(stage)
    except ValueError:
        return True
    words = [w for w in words if not re.fullmatch(r"\d*[<>]+&?\d*-?", w)]
    if words[:1] in (["export"], ["declare"], ["local"], ["readonly"]):
        words = [w for w in words[1:] if not w.startswith("-")] or ["export"]
        if all("=" in w for w in words):
            return any(sets_a_loader(w, named) for w in words)
    while words and (words[0] in KEYWORDS or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        if sets_a_loader(words.pop(0), named):
            return True  # PATH=pr/bin make, LD_PRELOAD=pr/x.so cat
    if not words:
        return False
    command = words[0]
    if command == "find":
        return bool({"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint"} & set(words))
    if command == "gh":
        return words[1:2] in (["extension"], ["ext"])  # `gh pr checkout`: RUN_CHECKOUT
    if command in READERS:
        return False
    if INTERPRETER.fullmatch(posixpath.basename(command)):
        return not runs_a_script_from_elsewhere(words[1:], named)
    return True


def sets_a_loader(word: str, named: list[re.Pattern]) -> bool:
    """`NAME=VALUE` pointing a variable that loads code (PATH, LD_PRELOAD...) into the checkout."""
    name, _, value = word.partition("=")
    return bool(LOADERS.fullmatch(name)) and any(p.search(value) for p in named)


def runs_a_script_from_elsewhere(args: list[str], named: list[re.Pattern]) -> bool:
    """`python3 -I main/ci/x.py pr`: options, then a script path outside the checkout."""
    for arg in args:
        if arg.startswith("-"):
            if re.fullmatch(r"-[IuBEsPOqd]+", arg):
                continue
            return False  # -c, -m, -e, --require...: code or a module from elsewhere
        return "$" not in arg and "EXPR" not in arg and not any(p.search(arg) for p in named)
    return False  # no script: it reads code from stdin


def shell_runs(run: str, paths: list[str]) -> str | None:
    """The command of `run` that runs code under one of `paths`, or None."""
    named = [mentions(p) for p in paths] + [re.compile(DATA)]
    text = normalised(run)
    # Command and process substitutions, innermost first: a command is checked on its own, and
    # its output stands in its place as the checkout's data (DATA) when it names the checkout,
    # so `eval "$(cat pr/x)"` or `bash <(cat pr/x)` runs it and `echo "$(cat pr/x)"` does not.
    while match := SUBSTITUTION.search(text):
        inner = next(g for g in match.groups() if g is not None)
        why = units_run(inner, named)
        if why:
            return why
        stand_in = DATA if any(p.search(inner) for p in named) else "OUTPUT"
        text = text[: match.start()] + stand_in + text[match.end() :]
    return units_run(text, named)


def units_run(text: str, named: list[re.Pattern]) -> str | None:
    for unit in UNIT_END.split(text):
        unit = unit.strip()
        if not unit or not any(p.search(unit) for p in named):
            continue
        if re.search(r"\bGITHUB_(?:ENV|PATH)\b", unit):
            return unit.replace(DATA, "$(...)")
        for stage in re.split(r"(?<![|>])\|(?!\|)", unit):
            if stage_runs(stage.strip(), named):
                unit = unit.replace(DATA, "$(...)")
                return unit if len(unit) <= 80 else unit[:77] + "..."
    return None


def step_runs(step: dict, paths: list[str], workdir: str) -> str | None:
    """Why this step runs code of the checkouts at `paths` (not the root), or None."""
    uses = str(step.get("uses", ""))
    named = [mentions(p) for p in paths]
    if uses.startswith("./") and any(p.search(uses) for p in named):
        return f"uses {uses}"
    if "run" in step:  # working-directory (or defaults.run's) applies to run: steps only
        where = str(step.get("working-directory") or workdir)
        place = folder(where)
        if "$" in WORKSPACE.sub(".", where) or any(
            place == p or place.startswith(p + "/") for p in paths
        ):
            return f"working-directory: {where}"  # in the checkout, or a folder not known here
        return shell_runs(str(step["run"]), paths)
    options = step.get("with") if isinstance(step.get("with"), dict) else {}
    if uses and any(p.search(normalised(str(v))) for v in options.values() for p in named):
        return f"gives {uses.split('@')[0]} its files"
    return None


def token_sources(doc: dict, job: dict, step: dict) -> list[str]:
    """Where a token reaches this step (empty: none)."""
    container = job.get("container") if isinstance(job.get("container"), dict) else {}
    found = []
    for where, env in (
        ("workflow env", doc.get("env")),
        ("job env", job.get("env")),
        ("container env", container.get("env")),
        ("env", step.get("env")),
        ("with:", step.get("with")),
    ):
        if isinstance(env, dict):
            found += [f"{where} {k}" for k, v in env.items() if TOKEN.search(str(v))]
        elif env and TOKEN.search(str(env)):
            found.append(where)
    if TOKEN.search(str(step.get("run", ""))):
        found.append("a token in run:")
    permissions = job.get("permissions", doc.get("permissions"))
    if permissions == "write-all" or (
        isinstance(permissions, dict) and permissions.get("id-token") == "write"
    ):
        found.append("id-token: write")
    return found


def step_label(step: dict, index: int) -> str:
    """The step's name, else its number and what it is: `3 (actions/checkout)`."""
    if step.get("name"):
        return str(step["name"])
    what = str(step.get("uses", "")).split("@")[0] or step.get("id") or "run"
    return f"{index} ({what})"


def untrusted_code_offences(doc: dict, name: str, job: dict, decides_image: bool) -> list[str]:
    """Rule 3 for one job."""
    steps = job.get("steps") or []
    cross_run = "workflow_run" in triggers(doc)
    problems = credential_offences(name, steps, cross_run)
    paths: list[str] = []
    ran = ""  # why every later step counts as running the code
    workdir = ""  # defaults.run.working-directory, the job's over the workflow's
    for owner in (doc, job):
        defaults = owner.get("defaults")
        run = defaults.get("run") if isinstance(defaults, dict) else None
        if isinstance(run, dict) and run.get("working-directory"):
            workdir = str(run["working-directory"])
    for index, step in enumerate(steps, 1):
        label = f"job {name} step {step_label(step, index)}"
        path = untrusted_checkout(step, cross_run)
        if path is not None:
            paths.append(path)
        elif paths:
            why = ran or step_runs(step, [p for p in paths if p], workdir)
            problems += step_offences(doc, job, step, label, paths, why)
            if why and not ran and not why.startswith("gives "):
                if decides_image:
                    problems.append(
                        f"{label}: runs code of a checkout chosen elsewhere ({why}) in a job "
                        "whose output picks an image; read it as data with the workflow's own "
                        "scripts"
                    )
                ran = f"ran in step {step_label(step, index)}"
        if path is None and RUN_CHECKOUT.search(normalised(str(step.get("run", "")))):
            path = ""
            paths.append(path)
        if path == "" and not ran:
            ran = f"put in the workspace root by step {step_label(step, index)}"
            if decides_image:
                problems.append(
                    f"{label}: checks out code chosen elsewhere into the workspace root in a "
                    "job whose output picks an image; check it out under a path: and read it as "
                    "data"
                )
    return problems


def credential_offences(name: str, steps: list[dict], cross_run: bool) -> list[str]:
    """In a job that checks out code chosen elsewhere, no checkout leaves the token on disk."""
    if all(untrusted_checkout(s, cross_run) is None for s in steps):
        return []
    problems = []
    for index, step in enumerate(steps, 1):
        options = step.get("with") if isinstance(step.get("with"), dict) else {}
        if not is_checkout(step) or str(options.get("persist-credentials")).lower() == "false":
            continue
        what = (
            "checks out code chosen elsewhere with its credentials persisted"
            if untrusted_checkout(step) is not None
            else "persists its credentials in a job that checks out code chosen elsewhere"
        )
        problems.append(
            f"job {name} step {step_label(step, index)}: {what} (the token in .git/config, where "
            "that code can read it); set persist-credentials: false"
        )
    return problems


def step_offences(
    doc: dict, job: dict, step: dict, label: str, paths: list[str], why: str | None
) -> list[str]:
    """A step after a checkout of code chosen elsewhere: sources it, or holds a token as it runs."""
    problems = []
    run = str(step.get("run", ""))
    if SOURCES.search(run) and ("" in paths or any(mentions(p).search(run) for p in paths)):
        problems.append(
            f"{label}: sources files of a checkout chosen elsewhere (a pull request's); read "
            "them as data with a strict KEY=VALUE reader (ci/gpu-image.py)"
        )
    tokens = token_sources(doc, job, step)
    if tokens and why:
        after = why.startswith("ran in ")
        problems.append(
            f"{label}: holds a token ({', '.join(tokens)}) "
            + (
                f"after code of a checkout chosen elsewhere {why}"
                if after
                else f"where code of a checkout chosen elsewhere runs ({why})"
            )
            + "; run only the workflow's own scripts in a step with a token, in a job that runs "
            "none of that code"
        )
    return problems


def image_deciders(doc: dict) -> set[str]:
    """Jobs whose outputs choose another job's container or service image."""
    deciders = set()
    for job in (doc.get("jobs") or {}).values():
        if not isinstance(job, dict):
            continue
        images = [job.get("container")]
        services = job.get("services")
        images += list(services.values()) if isinstance(services, dict) else []
        text = " ".join(str(i.get("image") if isinstance(i, dict) else i) for i in images if i)
        deciders.update(re.findall(r"needs\.([A-Za-z0-9_-]+)\.outputs\.", text))
    return deciders


def shape_problem(doc: object) -> str | None:
    """Why this YAML is not a workflow this rule can read (GitHub refuses it too), or None."""
    if not isinstance(doc, dict):
        return "not a workflow (a mapping with on: and jobs:)"
    on = doc.get("on", doc.get(True))
    if isinstance(on, list) and not all(isinstance(x, str) for x in on):
        return f"on: {on!r} is not a list of event names"
    if not isinstance(doc.get("jobs") or {}, dict):
        return "jobs: is not a mapping"
    for name, job in (doc.get("jobs") or {}).items():
        if not isinstance(job, dict):
            return f"job {name} is not a mapping"
        if "uses" in job and not isinstance(job["uses"], str):
            return f"job {name}: uses: is not a string"
        steps = job.get("steps") or []
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            return f"job {name}: steps: is not a list of mappings"
    return None


def load(root: Path) -> tuple[dict[Path, dict], list[str], set[str]]:
    """The workflows that can be read, one line for each that cannot, the declared labels."""
    workflows = root / ".github" / "workflows"
    config = root / ".github" / "actionlint.yaml"
    declared: set[str] = set()
    problems = []
    try:
        settings = yaml.safe_load(config.read_text()) if config.is_file() else {}
        labels = (settings or {}).get("self-hosted-runner", {}).get("labels", [])
        declared = {str(x).lower() for x in labels}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError) as err:
        problems.append(f".github/actionlint.yaml: cannot read its labels ({err})".split("\n")[0])
    docs = {}
    for path in sorted([*workflows.glob("*.yml"), *workflows.glob("*.yaml")]):
        rel = path.relative_to(root)
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            problems.append(f"{rel}: not YAML ({' '.join(str(err).split())})")
            continue
        why = shape_problem(doc)
        if why:
            problems.append(f"{rel}: {why}")
        else:
            docs[path] = doc
    return docs, problems, declared


def check(root: Path) -> list[str]:
    docs, problems, declared = load(root)

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
            if uses:
                return f"job {name} calls {uses}, a remote workflow that may run self-hosted"
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
        events = triggers(doc) - set(MAINTAINER_EVENTS)
        why = reaches_self_hosted(path)
        if events and why:
            problems.append(
                f"{rel}: {why} and it triggers on {', '.join(sorted(events))}; self-hosted "
                "runners take only main's definitions started by a maintainer "
                f"({', '.join(MAINTAINER_EVENTS)}): see docs/gpu-runners.md"
            )
        deciders = image_deciders(doc)
        for name, job in (doc.get("jobs") or {}).items():
            for line in untrusted_code_offences(doc, name, job, name in deciders):
                problems.append(f"{rel}: {line}")
            steps = job.get("steps") or []
            refs = [job.get("uses")] + [s.get("uses") for s in steps]
            for ref in refs:
                ref = str(ref) if ref else ""
                if ref and not ref.startswith(("./", "docker://")) and not PINNED.match(ref):
                    problems.append(f"{rel}: job {name} uses {ref}: pin it by a full commit SHA")
    return problems


def action_offences(root: Path) -> list[str]:
    """The repository's own action (action.yml): every remote `uses:` pinned, and inputs reach a
    `run:` only through `env:` (an expression spliced into the script is shell a caller wrote)."""
    path = root / "action.yml"
    if not path.is_file():
        return []
    try:
        steps = yaml.safe_load(path.read_text(encoding="utf-8"))["runs"]["steps"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as err:
        return [f"action.yml: not an action's YAML ({' '.join(str(err).split())})"]
    problems = []
    for index, step in enumerate(steps):
        label = step_label(step, index)
        ref = str(step.get("uses") or "")
        if ref and not ref.startswith(("./", "docker://")) and not PINNED.match(ref):
            problems.append(f"action.yml: {label} uses {ref}: pin it by a full commit SHA")
        if "${{" in str(step.get("run") or ""):
            problems.append(f"action.yml: {label}: an expression in run: (pass it through env:)")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1])
    if not (root / ".github" / "workflows").is_dir():
        print(f"check-workflows: error: no .github/workflows under {root}", file=sys.stderr)
        return 2
    problems = check(root) + action_offences(root)
    for line in problems:
        print(f"check-workflows: {line}", file=sys.stderr)
    if not problems:
        print(
            f"check-workflows: {root / '.github/workflows'} and action.yml: no self-hosted job "
            "on an event a maintainer does not start, every action pinned, no token or image "
            "choice beside code checked out from elsewhere, no expression in an action's run:"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
