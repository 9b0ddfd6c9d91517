"""The reusable GPU workflow (.github/workflows/lockstep-gpu.yml) that users call.

Its fork safety where nothing here can run GitHub Actions: the workflow and the documented caller
pass ci/check-workflows.py, actionlint and zizmor, and a pull-request caller is refused; the
`decide` step's own shell runs with the variables GitHub sets and its `env:` as GitHub would
expand it (an expression it does not know fails the test), and lets a pull request's head
through only on recorded REST answers where a maintainer approved that commit. `gh` is answered
from those files in ci/gpu-pr-gate.py's --replay layout, since nothing here reaches GitHub.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "lockstep-gpu.yml"
CHECK = ROOT / "ci" / "check-workflows.py"
GATE = ROOT / "ci" / "gpu-pr-gate.py"
REPO = "org/app"
HEAD = "a" * 40
NEWER = "c" * 40
OWN = "e" * 40  # the caller's own commit (github.sha)
IMAGE = "ghcr.io/org/train@sha256:" + "d" * 64
TOKEN = re.compile(r"\$\{\{[^}]*?(?<![\w.])(?:secrets\b|github\.token\b)")


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} is not in this environment (the locked CPU venv has it)")
    return str(path)


def tools_env() -> dict[str, str]:
    """PATH with the venv's tools first: actionlint runs shellcheck on every run: it finds."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), str(root)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_the_workflow_passes_the_rule_actionlint_and_zizmor():
    result = run_check(ROOT)
    assert result.returncode == 0 and "lockstep-gpu.yml" not in result.stderr, result.stderr
    lint = subprocess.run(
        [tool("actionlint"), "-config-file", ".github/actionlint.yaml", str(WORKFLOW)],
        cwd=ROOT, capture_output=True, text=True, env=tools_env(), timeout=120,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout
    audit = subprocess.run(
        [tool("zizmor"), "--offline", "--min-severity", "low", str(WORKFLOW)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout


# ---- the caller ------------------------------------------------------------------------------


def documented_caller() -> str:
    """The caller block of docs/gpu-runners.md, its placeholders filled as a user fills them."""
    text = (ROOT / "docs" / "gpu-runners.md").read_text()
    section = text.split("## Call it from your repository", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "docs/gpu-runners.md shows no caller"
    return (
        block.group(1)
        .replace("OWNER/", "org/")
        .replace("LOCKSTEP_SHA", "b" * 40)
        .replace("IMAGE_DIGEST", "d" * 64)
    )


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A repository with this one's .github and the given workflows; a git root for actionlint."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / ".github", root / ".github")
    for name, text in files.items():
        (root / ".github" / "workflows" / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=30)
    return root


def test_the_documented_caller_passes_the_rule_and_the_lints(tmp_path):
    caller = documented_caller()
    doc = yaml.safe_load(caller)
    triggers = doc.get("on", doc.get(True))
    assert set(triggers) == {"push", "workflow_dispatch"}
    assert triggers["push"] == {"branches": ["main"]}
    assert len(caller.splitlines()) <= 25
    root = plant(tmp_path, {"gpu-caller.yml": caller})
    result = run_check(root)
    assert result.returncode == 0, result.stderr
    audit = subprocess.run(
        [tool("zizmor"), "--offline", "--min-severity", "low", str(root / ".github/workflows")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout


def test_actionlint_checks_the_callers_inputs_against_the_workflow(tmp_path):
    """Called as `./.github/workflows/lockstep-gpu.yml`, actionlint reads the inputs it declares:
    the documented caller passes, a misspelt input and a missing image fail."""
    local = re.sub(
        r"org/lockstep/(\.github/workflows/lockstep-gpu\.yml)@\S+", r"./\1", documented_caller()
    )
    assert "uses: ./.github/workflows/lockstep-gpu.yml" in local
    lint = [tool("actionlint"), "-config-file", ".github/actionlint.yaml"]
    root = plant(tmp_path, {"gpu-caller.yml": local})
    ok = subprocess.run(
        [*lint], cwd=root, capture_output=True, text=True, env=tools_env(), timeout=120
    )
    assert ok.returncode == 0, ok.stdout
    bad = local.replace("      gate: train\n", "      gaet: train\n").replace(
        "      image:", "      imgae:"
    )
    (root / ".github/workflows/gpu-caller.yml").write_text(bad)
    found = subprocess.run(
        [*lint], cwd=root, capture_output=True, text=True, env=tools_env(), timeout=120
    )
    assert found.returncode == 1 and '"gaet"' in found.stdout, found.stdout
    assert '"image" is required' in found.stdout, found.stdout


@pytest.mark.parametrize(
    "event", ["pull_request", "pull_request_target", "workflow_run", "issue_comment"]
)
def test_a_caller_on_an_event_a_maintainer_does_not_start_is_refused(tmp_path, event):
    """Remote (`uses: OWNER/REPO/...@SHA`, maybe self-hosted) and local (its runs-on is an
    expression): both refused by the rule."""
    remote = documented_caller().replace(
        "on:\n  push:\n    branches: [main]\n", f"on:\n  {event}:\n  push:\n    branches: [main]\n"
    )
    local = re.sub(r"org/lockstep/(\.github/workflows/lockstep-gpu\.yml)@\S+", r"./\1", remote)
    root = plant(tmp_path, {"remote.yml": remote, "local.yml": local})
    result = run_check(root)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any(
        "remote.yml: job lockstep calls org/lockstep/.github/workflows/lockstep-gpu.yml@" in x
        and f"it triggers on {event}" in x
        for x in lines
    ), result.stderr
    assert any(
        "local.yml: job lockstep calls ./.github/workflows/lockstep-gpu.yml, where job gpu has "
        "runs-on"
        in x
        and f"it triggers on {event}" in x
        for x in lines
    ), result.stderr


# ---- the decide job's step, run as GitHub runs it -------------------------------------------


def step(job: str, name_or_id: str) -> dict:
    steps = workflow()["jobs"][job]["steps"]
    (found,) = [s for s in steps if name_or_id in (s.get("id"), s.get("name"))]
    return found


def expand(env: dict, context: dict[str, str]) -> dict[str, str]:
    """The step's env: as GitHub expands it; an expression this test does not know fails it."""
    unknown = sorted(
        {e.strip() for v in env.values() for e in re.findall(r"\$\{\{(.*?)\}\}", str(v))}
        - set(context)
    )
    if unknown:
        pytest.fail(f"expressions this test does not implement: {unknown}")
    return {
        key: re.sub(r"\$\{\{(.*?)\}\}", lambda m: context[m.group(1).strip()], str(value))
        for key, value in env.items()
    }


def gh_replay(tmp_path: Path, answers: dict[str, object]) -> Path:
    """A `gh` on PATH that answers `gh api [--paginate --slurp] PATH` from recorded files."""
    folder = tmp_path / "api"
    folder.mkdir()
    for path, data in answers.items():
        (folder / (path.replace("/", "_") + ".json")).write_text(json.dumps(data))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(
        f"#!{sys.executable} -I\n"
        "import json, sys\n"
        "from pathlib import Path\n"
        "args = sys.argv[1:]\n"
        "assert args[:1] == ['api'], args\n"
        f"file = Path({str(folder)!r}) / (args[-1].replace('/', '_') + '.json')\n"
        "if not file.is_file():\n"
        "    sys.exit(f'gh: Not Found (HTTP 404) {args[-1]}')\n"
        "data = json.loads(file.read_text())\n"
        "print(json.dumps([data] if '--slurp' in args else data))\n"
    )
    gh.chmod(0o755)
    return bin_dir


def api_answers(reviews: list[dict], head: str = HEAD) -> dict[str, object]:
    """GitHub's REST answers for PR #7 of org/app (the shapes tests/test_gpu_pr_gate.py uses)."""
    answers: dict[str, object] = {
        f"repos/{REPO}/pulls/7": {
            "number": 7, "state": "open", "head": {"sha": head}, "user": {"login": "author"},
        },
        f"repos/{REPO}/pulls/7/reviews": reviews,
    }  # fmt: skip
    for login, level in {"maint": "maintain", "reader": "read", "author": "write"}.items():
        answers[f"repos/{REPO}/collaborators/{login}/permission"] = {"permission": level}
    return answers


def approval(login: str, commit: str, at: str = "2026-11-01T10:00:00Z") -> dict:
    return {"user": {"login": login}, "state": "APPROVED", "commit_id": commit, "submitted_at": at}


def decide(
    tmp_path: Path,
    *,
    event: str = "push",
    ref: str = "refs/heads/main",
    pr: str = "",
    sha: str = "",
    image: str = IMAGE,
    labels: str = '["self-hosted", "linux", "x64", "gpu"]',
    answers: dict[str, object] | None = None,
) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """The decide step's shell in a workspace holding lockstep's checkout (`lockstep/`), with
    GitHub's variables; returns the run and what it wrote to $GITHUB_OUTPUT."""
    work = tmp_path / "work"
    (work / "lockstep" / "ci").mkdir(parents=True)
    shutil.copy(GATE, work / "lockstep" / "ci" / GATE.name)
    bin_dir = gh_replay(tmp_path, answers or {})
    the_step = step("decide", "decide")
    context = {
        "github.token": "ghs_recorded",
        "github.event.repository.default_branch": "main",
        "inputs.pull-request": pr,
        "inputs.sha": sha,
        "inputs.image": image,
        "inputs.runner-labels": labels,
        "inputs.shm-size": "16g",
    }
    output, summary = tmp_path / "output", tmp_path / "summary"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "GITHUB_EVENT_NAME": event,
        "GITHUB_REF": ref,
        "GITHUB_SHA": OWN,
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        **expand(the_step["env"], context),
    }
    script = tmp_path / "step.sh"
    script.write_text(the_step["run"])
    # `shell: bash` (the workflow's defaults), as the runner starts it
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=work, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    written = output.read_text() if output.exists() else ""
    return result, dict(line.split("=", 1) for line in written.splitlines())


def test_a_push_to_the_default_branch_runs_its_own_commit_in_the_image(tmp_path):
    result, outputs = decide(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert outputs == {"sha": OWN, "image": IMAGE}


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/pytorch:25.01-py3",  # a tag: it can move under the runner
        "ghcr.io/org/train",
        "ghcr.io/org/train:v1@sha256:" + "d" * 64,  # NAME@sha256 only
        "ghcr.io/org/train@sha256:" + "d" * 63,
        "ghcr.io/org/train@sha256:" + "d" * 64 + " --privileged",
        "ghcr.io/org/train@sha256:" + "d" * 64 + "\nx",
    ],
)
def test_an_image_not_given_by_digest_is_refused(tmp_path, image):
    result, outputs = decide(tmp_path, image=image)
    assert result.returncode == 1 and outputs == {}
    assert "::error::lockstep-gpu: image '" in result.stdout
    assert "must be NAME@sha256:<64 hex>" in result.stdout


@pytest.mark.parametrize(
    "image",
    ["ubuntu@sha256:" + "0" * 64, "localhost:5000/team/train-gpu@sha256:" + "f" * 64, IMAGE],
)
def test_an_image_by_digest_is_the_jobs_image(tmp_path, image):
    result, outputs = decide(tmp_path, image=image)
    assert result.returncode == 0 and outputs["image"] == image, result.stdout


@pytest.mark.parametrize(
    ("event", "ref", "why"),
    [
        ("pull_request", "refs/pull/7/merge", "called on pull_request"),
        ("pull_request_target", "refs/heads/main", "called on pull_request_target"),
        ("workflow_run", "refs/heads/main", "called on workflow_run"),
        ("issue_comment", "refs/heads/main", "called on issue_comment"),
        ("push", "refs/heads/feature", "push on refs/heads/feature: call it only on the default"),
        ("workflow_dispatch", "refs/heads/feature", "call it only on the default branch"),
    ],
)
def test_an_event_a_maintainer_does_not_start_on_the_default_branch_is_refused(
    tmp_path, event, ref, why
):
    """The called workflow sees its caller's event: even a caller a fork wrote stops here."""
    result, outputs = decide(
        tmp_path, event=event, ref=ref, pr="7", sha=HEAD,
        answers=api_answers([approval("maint", HEAD)]),
    )  # fmt: skip
    assert result.returncode == 1 and outputs == {}
    assert why in result.stdout, result.stdout


def test_a_schedule_runs_the_default_branch(tmp_path):
    result, outputs = decide(tmp_path, event="schedule")
    assert result.returncode == 0 and outputs["sha"] == OWN, result.stdout


@pytest.mark.parametrize("labels", ["self-hosted", "[]", '["gpu", 3]', '{"a": 1}'])
def test_runner_labels_that_are_not_a_json_array_are_refused(tmp_path, labels):
    result, outputs = decide(tmp_path, labels=labels)
    assert result.returncode == 1 and outputs == {}
    assert "runner-labels" in result.stdout


def test_a_sha_without_a_pull_request_is_refused(tmp_path):
    result, outputs = decide(tmp_path, event="workflow_dispatch", sha=NEWER)
    assert result.returncode == 1 and outputs == {}
    assert "sha without pull-request" in result.stdout


def test_a_maintainers_approval_of_the_head_runs_that_commit(tmp_path):
    result, outputs = decide(
        tmp_path, event="workflow_dispatch", pr="7", sha=HEAD,
        answers=api_answers([approval("maint", HEAD)]),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert outputs == {"sha": HEAD, "image": IMAGE}
    assert "gpu-pr-gate: allowed: #7 at aaaaaaaaaaaa: approved by maint" in result.stdout
    assert f"GPU run of PR #7 at {HEAD}" in (tmp_path / "summary").read_text()


@pytest.mark.parametrize("asked", [HEAD, NEWER])
def test_a_newer_unapproved_head_is_refused(tmp_path, asked):
    """Approved at HEAD, then pushed to NEWER: neither the old commit (no longer the head) nor the
    new one (nobody approved it) runs."""
    result, outputs = decide(
        tmp_path, event="workflow_dispatch", pr="7", sha=asked,
        answers=api_answers([approval("maint", HEAD)], head=NEWER),
    )  # fmt: skip
    assert result.returncode == 1 and outputs == {}
    assert "gpu-pr-gate: refused: " in result.stderr


def test_the_step_asks_the_rule_the_replay_answers(tmp_path):
    """The same decision from ci/gpu-pr-gate.py's own --replay, with the arguments the step
    passes it: approved head allowed, newer unapproved head refused."""
    run = step("decide", "decide")["run"]
    assert (
        'python3 -I lockstep/ci/gpu-pr-gate.py --repo "$GITHUB_REPOSITORY" --pr "$PR" --sha "$SHA"'
        in run
    )
    for head, asked, code in [(HEAD, HEAD, 0), (NEWER, NEWER, 1)]:
        folder = tmp_path / f"replay-{head[0]}"
        folder.mkdir()
        for path, data in api_answers([approval("maint", HEAD)], head=head).items():
            (folder / (path.replace("/", "_") + ".json")).write_text(json.dumps(data))
        result = subprocess.run(
            [sys.executable, "-I", str(GATE), "--repo", REPO, "--pr", "7", "--sha", asked,
             "--replay", str(folder)],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert result.returncode == code, result.stdout + result.stderr


# ---- the GPU job -----------------------------------------------------------------------------


def test_the_gpu_job_runs_the_decided_commit_in_the_decided_image_with_no_token():
    doc = workflow()
    assert set(doc["on"] if "on" in doc else doc[True]) == {"workflow_call"}
    assert doc["permissions"] == {}
    job = doc["jobs"]["gpu"]
    assert job["needs"] == "decide"
    assert job["runs-on"] == "${{ fromJSON(inputs.runner-labels) }}"
    assert job["permissions"] == {"contents": "read", "packages": "read"}
    assert job["container"]["image"] == "${{ needs.decide.outputs.image }}"
    assert (
        "--gpus all" in job["container"]["options"] and "--ipc" not in job["container"]["options"]
    )
    assert "env" not in job and "env" not in job["container"]
    for s in job["steps"]:
        found = TOKEN.search(json.dumps({k: s.get(k) for k in ("env", "with", "run")}))
        assert not found, f"step {s.get('name')} holds a token"
    checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert [c["with"].get("path") for c in checkouts] == [None, ".lockstep-action"]
    assert checkouts[0]["with"]["ref"] == "${{ needs.decide.outputs.sha }}"
    assert checkouts[1]["with"]["repository"] == "${{ job.workflow_repository }}"
    assert checkouts[1]["with"]["ref"] == "${{ job.workflow_sha }}"
    decide_job = doc["jobs"]["decide"]
    assert decide_job["permissions"] == {"contents": "read", "pull-requests": "read"}
    own = [s for s in decide_job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert [c["with"] for c in own] == [
        {
            "persist-credentials": False,
            "repository": "${{ job.workflow_repository }}",
            "ref": "${{ job.workflow_sha }}",
            "path": "lockstep",
        }
    ]
    assert all(c["with"]["persist-credentials"] is False for c in checkouts)
    for s in [*decide_job["steps"], *job["steps"]]:
        assert "${{" not in str(s.get("run", "")), f"{s.get('name')}: an expression in run:"


def test_every_input_of_the_action_passes_through_with_its_default():
    """The action (action.yml) is called with each of its inputs, taken from an input of the
    workflow of the same name and default: one NOT JUDGED policy, the action's."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    doc = workflow()
    declared = (doc["on"] if "on" in doc else doc[True])["workflow_call"]["inputs"]
    (call,) = [s for s in doc["jobs"]["gpu"]["steps"] if s.get("id") == "lockstep"]
    assert call["uses"] == "./.lockstep-action"
    # a pull request's run never hands out a golden; every other input is the caller's
    passed = {name: f"${{{{ inputs.{name} }}}}" for name in action["inputs"]}
    passed["upload-golden"] = "${{ inputs.pull-request == '' }}"
    assert call["with"] == passed
    for name, spec in action["inputs"].items():
        if name == "upload-golden":
            continue
        assert declared[name]["type"] == "string"
        assert str(declared[name].get("default", "")) == str(spec.get("default", "")), name
    outputs = (doc["on"] if "on" in doc else doc[True])["workflow_call"]["outputs"]
    assert {"verdict", "exit-code"} <= set(outputs) and set(outputs) <= set(action["outputs"])


def gpu_step(
    tmp_path: Path, name: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess:
    script = tmp_path / "gpu-step.sh"
    script.write_text(step("gpu", name)["run"])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_fewer_gpus_than_required_fails_never_skips(tmp_path):
    """On this machine (no nvidia-smi on an empty PATH, or no GPU): 0 seen."""
    name = "The runner shows the GPUs asked for (fewer fails, never skips)"
    bare = {"PATH": "/usr/bin:/bin"}
    result = gpu_step(tmp_path, name, {**bare, "REQUIRE_GPUS": "99"}, tmp_path)
    assert result.returncode == 1
    assert re.search(r"::error::lockstep-gpu: \d+ GPUs visible, 99 required", result.stdout)
    assert gpu_step(tmp_path, name, {**bare, "REQUIRE_GPUS": "0"}, tmp_path).returncode == 0
    # bash's arithmetic would run a command substitution in the variable: refused unread
    planted = {**bare, "REQUIRE_GPUS": "a[$(touch planted)]"}
    assert gpu_step(tmp_path, name, planted, tmp_path).returncode == 1
    assert not (tmp_path / "planted").exists()


def test_a_commit_with_the_actions_path_is_refused(tmp_path):
    """lockstep's action is checked out at .lockstep-action/ after the commit: a commit that has
    that path (a folder, or a link elsewhere) stops the job before it is used."""
    name = "The commit leaves .lockstep-action/ to lockstep's checkout"
    clean = tmp_path / "clean"
    clean.mkdir()
    assert gpu_step(tmp_path, name, {}, clean).returncode == 0
    for kind in ("dir", "link"):
        work = tmp_path / kind
        work.mkdir()
        if kind == "dir":
            (work / ".lockstep-action").mkdir()
        else:
            (work / ".lockstep-action").symlink_to(tmp_path / "nowhere")
        result = gpu_step(tmp_path, name, {}, work)
        assert result.returncode == 1 and "the commit has .lockstep-action" in result.stdout
