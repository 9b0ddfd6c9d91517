"""The GitHub workflows: fork code cannot reach the self-hosted GPU runners.

ci/check-workflows.py is the lint rule (`nox -s lint` runs it); here it is run on the repository
and on planted offences, and the GPU design is checked where a lint cannot see it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK = ROOT / "ci" / "check-workflows.py"


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def on(doc: dict) -> dict:
    return doc.get("on", doc.get(True))


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), str(root)], capture_output=True, text=True, check=False
    )


def test_repository_workflows_pass_the_rule():
    result = run_check(ROOT)
    assert result.returncode == 0, result.stderr


GPU_JOB = """
  gpu:
    runs-on: {runs_on}
    steps:
      - run: nox -s smoke
"""


@pytest.mark.parametrize("event", ["pull_request", "pull_request_target", "workflow_run"])
@pytest.mark.parametrize(
    "runs_on", ["[self-hosted, linux, x64, gpu]", "gpu", "${{ inputs.runner }}", "{group: gpu}"]
)
def test_a_self_hosted_job_on_a_pr_event_fails_the_rule(tmp_path, event, runs_on):
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / ".github/workflows/fork.yml").write_text(
        f"name: fork\non:\n  {event}:\njobs:" + GPU_JOB.format(runs_on=runs_on)
    )
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "fork.yml" in result.stderr and event in result.stderr


def test_a_pr_workflow_calling_a_self_hosted_reusable_workflow_fails(tmp_path):
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    wf = tmp_path / ".github/workflows"
    (wf / "reusable.yml").write_text("on: workflow_call\njobs:" + GPU_JOB.format(runs_on="gpu"))
    (wf / "caller.yml").write_text(
        "on: [pull_request]\njobs:\n  call:\n    uses: ./.github/workflows/reusable.yml\n"
    )
    result = run_check(tmp_path)
    assert result.returncode == 1 and "caller.yml: job call calls" in result.stderr


def test_unpinned_actions_fail_the_rule(tmp_path):
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / ".github/workflows/x.yml").write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - uses: actions/checkout@v7\n"
    )
    result = run_check(tmp_path)
    assert result.returncode == 1 and "pin it by a full commit SHA" in result.stderr


def test_gpu_workflow_runs_mains_definition_in_the_locked_image():
    gpu = load("gpu.yml")
    assert set(on(gpu)) == {"push", "workflow_dispatch"}
    assert on(gpu)["push"]["branches"] == ["main"]
    assert {"pr", "sha"} <= set(on(gpu)["workflow_dispatch"]["inputs"])
    job = gpu["jobs"]["gpu"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert job["container"]["image"] == "${{ needs.image.outputs.image }}"
    options = job["container"]["options"]
    assert "--gpus all" in options and "--ipc=host" in options
    assert job["env"]["LOCKSTEP_REQUIRE_GPUS"]
    checkout = job["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"] == {
        "persist-credentials": False,
        "ref": "${{ needs.image.outputs.sha }}",
    }
    # The image job refuses a PR run dispatched from anywhere but main, and yields a digest.
    image = gpu["jobs"]["image"]
    script = "\n".join(s.get("run", "") for s in image["steps"])
    assert "refs/heads/main" in script and "sha256:[0-9a-f]{64}" in script
    assert gpu["permissions"] == {}


def test_label_job_checks_out_nothing_and_can_only_dispatch():
    label = load("gpu-label.yml")
    assert set(on(label)) == {"pull_request_target"}
    assert on(label)["pull_request_target"]["types"] == ["labeled"]
    assert label["permissions"] == {}
    (job,) = label["jobs"].values()
    assert job["permissions"] == {"actions": "write"}
    assert job["runs-on"] == "ubuntu-24.04"
    assert all("uses" not in step for step in job["steps"]), "no action, no checkout"
    assert "gpu-ci" in job["if"]
    script = job["steps"][0]["run"]
    assert "gh workflow run gpu.yml" in script and "--ref main" in script
    assert "${{" not in script, "event data reaches the script only through env"


def test_only_the_publishing_job_may_write_packages():
    writers = []
    for path in WORKFLOWS.glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        assert (doc.get("permissions") or {}).get("packages") != "write", path.name
        for name, job in doc["jobs"].items():
            if (job.get("permissions") or {}).get("packages") == "write":
                writers.append((path.name, name, job["if"]))
    assert writers == [
        (
            "images.yml",
            "publish",
            "github.event_name != 'pull_request' && github.ref == 'refs/heads/main'",
        )
    ]
    publish = "\n".join(s.get("run", "") for s in load("images.yml")["jobs"]["publish"]["steps"])
    assert "--provenance mode=max --sbom true" in publish and "--push" in publish
    assert "ci/image-digest.py out/bake.json cuda" in publish


def test_ci_bootstraps_nox_from_its_hashed_lock_and_scopes_the_extra_index():
    for path in WORKFLOWS.glob("*.yml"):
        text = path.read_text()
        assert "pip install nox" not in text, path.name
        doc = yaml.safe_load(text)
        assert "PIP_EXTRA_INDEX_URL" not in (doc.get("env") or {}), path.name
    assert "pip install" not in (ROOT / ".ci" / "run").read_text()
    assert "ci/nox.sh -s tests" in (ROOT / ".ci" / "run").read_text()
    lock = (ROOT / "requirements" / "ci.txt").read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==\S+ \\\n\s+--hash=sha256:[0-9a-f]{64}", lock, flags=re.M)
    assert "nox" in pins and len(pins) == len(re.findall(r"^\S+==", lock, flags=re.M))
    script = (ROOT / "ci" / "nox.sh").read_text()
    assert "--require-hashes --no-deps -r" in script


def test_every_action_is_pinned_on_a_current_major():
    majors = {"actions/checkout": 7, "actions/setup-python": 7, "actions/upload-artifact": 7}
    for path in WORKFLOWS.glob("*.yml"):
        for ref, comment in re.findall(r"uses: (\S+)(?: # (\S+))?", path.read_text()):
            name, _, sha = ref.partition("@")
            assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{path.name}: {ref}"
            assert comment.startswith(f"v{majors[name]}."), f"{path.name}: {ref} # {comment}"
    dependabot = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    assert {u["package-ecosystem"] for u in dependabot["updates"]} == {"github-actions", "pip"}
