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
    # a /dev/shm of the container's own, sized; never the host's IPC namespace
    assert "--gpus all" in options and re.search(r"--shm-size=\d+g", options)
    assert "--ipc" not in options
    assert job["env"]["LOCKSTEP_REQUIRE_GPUS"]
    checkout = job["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"] == {
        "persist-credentials": False,
        "ref": "${{ needs.image.outputs.sha }}",
    }
    assert gpu["permissions"] == {}


def test_the_image_is_chosen_by_mains_scripts_reading_the_commit_as_data():
    image = load("gpu.yml")["jobs"]["image"]
    steps = image["steps"]
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    # main's scripts at main/, the commit under test at pr/, never at the workspace root
    assert [c["with"].get("path") for c in checkouts] == ["main", "pr"]
    assert checkouts[0]["with"]["ref"] == "${{ github.sha }}"
    assert all(c["with"]["persist-credentials"] is False for c in checkouts)
    script = "\n".join(s["run"] for s in steps if "run" in s)
    assert not re.search(r"(^|[\s;(])(source|\.) ", script) and "build-args.sh" not in script
    # every script a step runs is main's, in isolated mode (no PYTHONPATH, no script-dir import)
    assert re.findall(r"python3 -I (\S+)", script) == [
        "main/ci/gpu-pr-gate.py",
        "main/ci/gpu-candidates.py",
        "main/ci/gpu-image.py",
        "main/ci/gpu-image.py",
    ]
    assert "python3 -I main/ci/gpu-image.py tag pr" in script
    verify = next(s for s in steps if s.get("id") == "verify")
    assert "gh attestation verify" in verify["run"]
    assert '--signer-workflow "$GITHUB_REPOSITORY/.github/workflows/images.yml"' in verify["run"]
    assert "--source-ref refs/heads/main" in verify["run"]
    assert "gpu-image.py verify --image" in verify["run"]
    assert image["outputs"]["image"] == "${{ steps.verify.outputs.image }}"
    commit = next(s for s in steps if s.get("id") == "commit")
    assert steps.index(commit) < steps.index(checkouts[1]), "the gate runs before pr/ exists"
    assert "gpu-pr-gate.py" in commit["run"] and "refs/heads/main" in commit["run"]
    tag = next(s for s in steps if s.get("id") == "tag")
    assert "env" not in tag and "${{" not in tag["run"], "no token where pr/ is read"


# gpu.yml's image job as it was: the pull request's head at the workspace root, its
# docker/build-args.sh sourced in a step holding GITHUB_TOKEN, its output the GPU job's image.
OLD_GPU_WORKFLOW = """
name: gpu
on:
  workflow_dispatch:
    inputs: {sha: {type: string}}
permissions: {}
jobs:
  image:
    runs-on: ubuntu-24.04
    outputs:
      image: ${{ steps.digest.outputs.image }}
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
          ref: ${{ inputs.sha }}
      - name: Digest
        id: digest
        env:
          GH_TOKEN: ${{ github.token }}
        run: |
          set -a
          source <(docker/build-args.sh)
          set +a
          echo "image=ghcr.io/o/lockstep-cuda:$CUDA_TAG" >>"$GITHUB_OUTPUT"
  gpu:
    needs: image
    runs-on: [self-hosted, linux, x64, gpu]
    container:
      image: ${{ needs.image.outputs.image }}
    steps:
      - run: nox -s smoke
"""


def test_the_old_image_job_fails_the_rule(tmp_path):
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / ".github/workflows/gpu.yml").write_text(OLD_GPU_WORKFLOW)
    result = run_check(tmp_path)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any("job image" in x and "into the workspace root" in x for x in lines), lines
    assert any("step Digest: sources files of a checkout" in x for x in lines), lines
    assert any("step Digest: holds a token (env GH_TOKEN) where code" in x for x in lines), lines


@pytest.mark.parametrize(
    ("step", "offence"),
    [
        ('env: {T: "${{ secrets.X }}"}\n        run: bash pr/build.sh', "holds a token"),
        ("run: gh api x --token ${{ github.token }}; ./pr/setup", "holds a token"),
        ("run: . pr/env.sh", "sources files"),
        ('env: {GH_TOKEN: "${{ github.token }}"}\n        run: python3 -I main/x.py pr', None),
        ("run: cat pr/docker/base.lock", None),
    ],
)
def test_a_token_or_a_source_beside_a_checkout_chosen_elsewhere(tmp_path, step, offence):
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / ".github/workflows/x.yml").write_text(
        "on: workflow_dispatch\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1\n"
        "        with: {ref: '${{ inputs.sha }}', path: pr, persist-credentials: false}\n"
        f"      - name: s\n        {step}\n"
    )
    result = run_check(tmp_path)
    if offence is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1 and f"x.yml: job a step s: {offence}" in result.stderr


def test_label_job_checks_out_main_only_and_dispatches_what_a_maintainer_approved():
    label = load("gpu-label.yml")
    assert set(on(label)) == {"pull_request_target"}
    assert on(label)["pull_request_target"]["types"] == ["labeled"]
    assert label["permissions"] == {}
    (job,) = label["jobs"].values()
    assert job["permissions"] == {
        "actions": "write",
        "contents": "read",
        "pull-requests": "read",
    }
    assert job["runs-on"] == "ubuntu-24.04"
    (checkout,) = [s for s in job["steps"] if "uses" in s]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"] == {
        "persist-credentials": False,
        "ref": "refs/heads/main",
        "path": "main",
    }
    assert "gpu-ci" in job["if"]
    script = job["steps"][-1]["run"]
    gate = script.index('python3 -I main/ci/gpu-pr-gate.py --repo "$REPO" --pr "$PR" --sha "$SHA"')
    assert '--labeller "$LABELLER"' in script
    assert gate < script.index("gh workflow run gpu.yml"), "the gate comes before the dispatch"
    assert "--ref main" in script
    assert "${{" not in script, "event data reaches the script only through env"


def test_the_runner_wipes_its_work_folder_before_each_registration():
    script = (ROOT / "ci" / "setup-gpu-runner.sh").read_text()
    assert script.index('rm -rf "$home/_work"') < script.index("./config.sh --unattended")


CANDIDATES = ROOT / "ci" / "gpu-candidates.py"


@pytest.mark.parametrize(
    ("event", "ref", "pr", "allowed", "why"),
    [
        ("push", "refs/heads/main", "", True, "push on refs/heads/main: main's code"),
        ("workflow_dispatch", "refs/heads/main", "", True, "main's code"),
        ("workflow_dispatch", "refs/heads/main", "12", False, "pull request #12's code"),
        ("workflow_dispatch", "refs/heads/topic", "", False, "not refs/heads/main"),
        ("pull_request", "refs/pull/3/merge", "", False, "not refs/heads/main"),
        ("issue_comment", "refs/heads/main", "", False, "issue_comment is not an event"),
    ],
)
def test_candidate_goldens_are_decided_by_mains_script(event, ref, pr, allowed, why):
    result = subprocess.run(
        [sys.executable, "-I", str(CANDIDATES), "--event", event, "--ref", ref, "--pr", pr],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"candidates={'true' if allowed else 'false'}\n"
    assert why in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "args", [["--pr", "1;id"], ["--ref", "main\nx=1"], ["--event", "Push"], ["--pr", "-1"]]
)
def test_bad_input_to_the_candidates_rule_is_one_line_and_exit_2(args):
    base = {"--event": "push", "--ref": "refs/heads/main", "--pr": ""}
    base[args[0]] = args[1]
    result = subprocess.run(
        [sys.executable, "-I", str(CANDIDATES), *[x for kv in base.items() for x in kv]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpu-candidates: error: ")
    assert len(result.stderr.splitlines()) == 1


def uploads(job: dict) -> dict[str, dict]:
    return {s["with"]["name"]: s for s in job["steps"] if "upload-artifact" in s.get("uses", "")}


def test_candidate_goldens_leave_a_run_only_as_mains_workflow_decides():
    """The commit's noxfile.py records what it likes; main's definition decides what leaves."""
    image = load("gpu.yml")["jobs"]["image"]
    assert image["outputs"]["candidates"] == "${{ steps.candidates.outputs.candidates }}"
    steps = image["steps"]
    rule = next(s for s in steps if s.get("id") == "candidates")
    pr_checkout = next(s for s in steps if s.get("with", {}).get("path") == "pr")
    assert steps.index(rule) < steps.index(pr_checkout), "decided before the commit is fetched"
    assert "python3 -I main/ci/gpu-candidates.py" in rule["run"]
    assert '--pr "$PR"' in rule["run"] and rule["env"] == {"PR": "${{ inputs.pr }}"}
    for job, reports, candidates, condition in [
        (
            load("gpu.yml")["jobs"]["gpu"],
            "gpu-gate-reports",
            "gpu-gate-candidates",
            "always() && needs.image.outputs.candidates == 'true'",
        ),
        (
            load("ci.yml")["jobs"]["gate"],
            "gate-reports",
            "gate-candidates",
            "always() && github.event_name != 'pull_request' && github.ref == 'refs/heads/main'",
        ),
    ]:
        named = uploads(job)
        assert named[reports]["with"]["path"].split() == [
            "build/gate/",
            "!build/gate/candidates/",
        ]
        assert named[candidates]["with"]["path"] == "build/gate/candidates/"
        assert named[candidates]["if"] == condition
        assert [n for n, s in named.items() if "candidates" in s["with"]["path"]] == [
            reports,
            candidates,
        ]
    assert "candidates_allowed" not in (ROOT / "noxfile.py").read_text()
    # a dispatched pull request's run says so in its title
    assert "format('PR #{0} at {1}', inputs.pr, inputs.sha)" in load("gpu.yml")["run-name"]


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


def test_images_are_built_by_a_pinned_buildkit_and_carry_signed_provenance():
    images = load("images.yml")
    pin = images["env"]["BUILDKIT_IMAGE"]
    assert re.fullmatch(r"moby/buildkit:v[\d.]+@sha256:[0-9a-f]{64}", pin)
    creates = [
        s["run"]
        for job in images["jobs"].values()
        for s in job["steps"]
        if "buildx create" in s.get("run", "")
    ]
    assert len(creates) == 2 and all('--driver-opt "image=$BUILDKIT_IMAGE"' in c for c in creates)
    publish = images["jobs"]["publish"]
    assert publish["permissions"]["id-token"] == "write"
    assert publish["permissions"]["attestations"] == "write"
    attests = [s for s in publish["steps"] if "attest-build-provenance" in s.get("uses", "")]
    subjects = {s["with"]["subject-name"]: s["with"] for s in attests}
    cuda = subjects["${{ steps.push.outputs.cuda-name }}"]
    assert cuda["subject-digest"] == "${{ steps.push.outputs.cuda-digest }}"
    for path in WORKFLOWS.glob("*.yml"):
        for name, job in yaml.safe_load(path.read_text())["jobs"].items():
            if (job.get("permissions") or {}).get("id-token") == "write":
                assert (path.name, name) == ("images.yml", "publish")


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
    majors = {
        "actions/checkout": 7,
        "actions/setup-python": 7,
        "actions/upload-artifact": 7,
        "actions/attest-build-provenance": 3,
    }
    for path in [*WORKFLOWS.glob("*.yml"), ROOT / "action.yml"]:
        found = re.findall(r"^\s*(?:- )?uses: (\S+)(?: # (\S+))?", path.read_text(), re.M)
        for ref, comment in found:
            if ref.startswith("./"):  # a local action: this repository's, or lockstep-gpu.yml's
                continue  # checkout of lockstep at the workflow's own commit
            name, _, sha = ref.partition("@")
            assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{path.name}: {ref}"
            assert comment.startswith(f"v{majors[name]}."), f"{path.name}: {ref} # {comment}"
    dependabot = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    assert {u["package-ecosystem"] for u in dependabot["updates"]} == {"github-actions", "pip"}


# Issue 37: workflows that passed the rule. Each is planted beside the repository's own and must
# be refused with one line naming the file, the job and the step. The script runs once for all
# of them (each line names its file), so that the cases cost one start of it.
CHECKOUT = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1"
PR_CHECKOUT = f"""      - name: pr
        uses: {CHECKOUT}
        with:
          ref: ${{{{ github.event.pull_request.head.sha }}}}
          path: pr
          persist-credentials: false
"""
SECRET_ENV = "        env:\n          GH_TOKEN: ${{ secrets.GITHUB_TOKEN }}\n"


def planted(head: str, *steps: tuple[str, str], job: str = "") -> str:
    """A pull_request_target workflow with one hosted job `build`: the PR's head at pr/, then steps."""
    return (
        f"on: pull_request_target\npermissions: {{}}\n{head}jobs:\n  build:\n"
        f"    runs-on: ubuntu-24.04\n{job}    steps:\n{PR_CHECKOUT}"
        + "".join(f"      - name: {name}\n{body}" for name, body in steps)
    )


PLANTED = {
    "job env GH_TOKEN beside a PR checkout": (
        planted(
            "",
            ("Build", "        run: bash pr/build.sh\n"),
            job="    env:\n      GH_TOKEN: ${{ secrets.GITHUB_TOKEN }}\n",
        ),
        "job build step Build: holds a token (job env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (bash pr/build.sh)",
    ),
    "workflow env secret beside a PR checkout": (
        planted("env:\n  NPM_TOKEN: ${{ secrets.NPM }}\n", ("Build", "        run: make -C pr\n")),
        "job build step Build: holds a token (workflow env NPM_TOKEN) where code of a checkout "
        "chosen elsewhere runs (make -C pr)",
    ),
    "container env secret beside a PR checkout": (
        planted(
            "",
            ("Test", "        run: pytest pr/tests\n"),
            job="    container:\n      image: python:3\n      env:\n        KEY: ${{ secrets.K }}\n",
        ),
        "job build step Test: holds a token (container env KEY) where code",
    ),
    "id-token: write beside PR code": (
        planted(
            "",
            ("Build", "        run: bash pr/build.sh\n"),
            job="    permissions:\n      id-token: write\n",
        ),
        "job build step Build: holds a token (id-token: write) where code",
    ),
    "cd pr && ./build.sh": (
        planted("", ("Build", SECRET_ENV + "        run: cd pr && ./build.sh\n")),
        "job build step Build: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (cd pr)",
    ),
    "pip install -e pr": (
        planted("", ("Install", SECRET_ENV + "        run: pip install -e pr\n")),
        "job build step Install: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (pip install -e pr)",
    ),
    "working-directory: pr with a secret": (
        planted(
            "",
            ("Make", SECRET_ENV + "        working-directory: pr\n        run: make\n"),
        ),
        "job build step Make: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (working-directory: pr)",
    ),
    "job defaults working-directory: pr with a secret": (
        planted(
            "",
            ("Make", SECRET_ENV + "        run: make\n"),
            job="    defaults:\n      run:\n        working-directory: ./pr\n",
        ),
        "job build step Make: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (working-directory: ./pr)",
    ),
    "a secret given to an action that builds the PR": (
        planted(
            "",
            (
                "Push",
                f"        uses: {CHECKOUT.replace('actions/checkout', 'docker/build-push-action')}\n"
                "        with:\n          context: pr\n          secrets: ${{ secrets.NPM }}\n",
            ),
        ),
        "job build step Push: holds a token (with: secrets) where code",
    ),
    "a local action of the PR": (
        planted(
            "",
            (
                "Act",
                "        uses: ./pr/.github/actions/x\n        with:\n"
                "          token: ${{ github.token }}\n",
            ),
        ),
        "job build step Act: holds a token (with: token) where code",
    ),
    "a token in a step after the PR's code ran": (
        planted(
            "",
            ("Build", "        run: bash pr/build.sh\n"),
            ("Comment", SECRET_ENV + "        run: gh pr comment 1 --body done\n"),
        ),
        "job build step Comment: holds a token (env GH_TOKEN) after code of a checkout chosen "
        "elsewhere ran in step Build",
    ),
    "the PR's data written to GITHUB_ENV": (
        planted(
            "",
            ("Env", '        run: cat pr/ci.env >>"$GITHUB_ENV"\n'),
            ("Comment", SECRET_ENV + "        run: python3 -I main/ci/comment.py\n"),
        ),
        "job build step Comment: holds a token (env GH_TOKEN) after code of a checkout chosen "
        "elsewhere ran in step Env",
    ),
    "gh pr checkout in a run step": (
        planted(
            "",
            ("Fetch", SECRET_ENV + '        run: gh pr checkout "$PR"\n'),
            ("Build", SECRET_ENV + "        run: make\n"),
        ),
        "job build step Build: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (put in the workspace root by step Fetch)",
    ),
    "a pull request run's artifact in a workflow_run workflow": (
        (
            "on:\n  workflow_run:\n    workflows: [ci]\n    types: [completed]\n"
            "permissions: {}\njobs:\n  report:\n    runs-on: ubuntu-24.04\n    steps:\n"
            f"      - uses: {CHECKOUT.replace('checkout', 'download-artifact')}\n"
            "        with:\n          name: build\n"
            f"      - name: Report\n{SECRET_ENV}        run: ./report.sh\n"
        ),
        "job report step Report: holds a token (env GH_TOKEN) where code of a checkout chosen "
        "elsewhere runs (put in the workspace root by step 1 (actions/download-artifact))",
    ),
    "a PR checkout that keeps the token in .git/config": (
        planted("", ("Build", "        run: bash pr/build.sh\n")).replace(
            "          persist-credentials: false\n", ""
        ),
        "job build step pr: checks out code chosen elsewhere with its credentials persisted",
    ),
    "an image job that runs the PR's code": (
        planted(
            "",
            (
                "Tag",
                '        id: tag\n        run: bash pr/docker/build-args.sh >>"$GITHUB_OUTPUT"\n',
            ),
        ).replace(
            "    runs-on: ubuntu-24.04\n",
            "    runs-on: ubuntu-24.04\n    outputs:\n      image: ${{ steps.tag.outputs.image }}\n",
        )
        + "  run:\n    needs: build\n    runs-on: ubuntu-24.04\n    container:\n"
        "      image: ${{ needs.build.outputs.image }}\n    steps:\n      - run: 'true'\n",
        "job build step Tag: runs code of a checkout chosen elsewhere (bash pr/docker/build-args.sh "
        '>>"$GITHUB_OUTPUT") in a job whose output picks an image',
    ),
}
# Other shapes of running the PR's files in a step that holds a token (one workflow, a job for
# each): the line must name the job and the step.
RUN_FORMS = [
    '"$GITHUB_WORKSPACE/pr/build.sh"',
    "cat pr/setup.txt | sh",
    'eval "$(cat pr/env.sh)"',
    "bash <(cat pr/x)",
    "python3 < pr/x.py",
    "python -m pip install -e ./pr[dev]",
    "pip install -r pr/requirements.txt",
    "npm --prefix pr install",
    "nox -f pr/noxfile.py",
    "docker buildx bake -f pr/docker-bake.hcl",
    "PATH=pr/bin:$PATH make",
    "export PYTHONPATH=pr",
    "LD_PRELOAD=pr/x.so cat README",
    "find pr -name '*.sh' -exec {} ;",
    "cp pr/gate.py main/ci/gpu-pr-gate.py",
    "pushd pr",
    "../pr/x",
    "sudo pr/x",
]
# Main reading the PR as data, with a token: none of these is an offence.
DATA_FORMS = [
    "python3 -I main/ci/gpu-image.py tag pr",
    "sha256sum pr/docker/base.lock pr/requirements/cuda.txt",
    'gh pr view "$PR" --json headRefOid',
    "cmp main/requirements/cuda.txt pr/requirements/cuda.txt",
    'tag=$(python3 -I main/ci/gpu-image.py tag pr); echo "$tag"',
    "jq .x pr/a.json | python3 -I main/ci/x.py",
]
# Events someone without write access can start, or that run a pull request's files or code;
# repository_dispatch: whoever holds a token that may write, with a payload of their choosing.
NOT_A_MAINTAINERS = [
    "issue_comment", "issues", "pull_request_review", "pull_request_review_comment",
    "discussion", "discussion_comment", "merge_group", "check_run", "check_suite", "status",
    "fork", "watch", "workflow_run", "pull_request_target", "repository_dispatch",
]  # fmt: skip
CALLS_REMOTE = (
    f"on: pull_request\njobs:\n  call:\n    uses: org/infra/.github/workflows/gpu.yml@{'a' * 40}\n"
)


def plant(tmp_path: Path, files: dict[str, str | bytes]) -> subprocess.CompletedProcess:
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    for name, text in files.items():
        data = text if isinstance(text, bytes) else text.encode()
        (tmp_path / ".github/workflows" / name).write_bytes(data)
    return run_check(tmp_path)


@pytest.fixture(scope="module")
def planted_lines(tmp_path_factory) -> list[str]:
    files = {f"planted-{i}.yml": text for i, (text, _) in enumerate(PLANTED.values())}
    files["forms.yml"] = "on: pull_request_target\npermissions: {}\njobs:\n" + "".join(
        f"  form-{i}:\n    runs-on: ubuntu-24.04\n    steps:\n{PR_CHECKOUT}      - name: s\n"
        f"{SECRET_ENV}        run: |\n          {run}\n"
        for i, run in enumerate(RUN_FORMS)
    )
    for event in NOT_A_MAINTAINERS:
        files[f"on-{event}.yml"] = f"on: [push, {event}]\njobs:" + GPU_JOB.format(
            runs_on="[self-hosted]"
        )
    files["case.yml"] = "on: pull_request\njobs:" + GPU_JOB.format(runs_on="[Self-Hosted, Linux]")
    files["case-label.yml"] = "on: pull_request\njobs:" + GPU_JOB.format(runs_on="[x64, GPU]")
    files["remote.yml"] = CALLS_REMOTE
    result = plant(tmp_path_factory.mktemp("planted"), files)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.splitlines()


def lines_of(lines: list[str], name: str) -> list[str]:
    return [x for x in lines if x.startswith(f"check-workflows: .github/workflows/{name}: ")]


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_planted_workflow_is_refused_naming_file_job_and_step(planted_lines, case):
    name = f"planted-{list(PLANTED).index(case)}.yml"
    reason = PLANTED[case][1]
    lines = lines_of(planted_lines, name)
    assert any(x.startswith(f"check-workflows: .github/workflows/{name}: {reason}") for x in lines)


@pytest.mark.parametrize("form", RUN_FORMS)
def test_every_form_of_running_the_checkout_with_a_token_is_refused(planted_lines, form):
    job = f"job form-{RUN_FORMS.index(form)} step s:"
    (line,) = [x for x in lines_of(planted_lines, "forms.yml") if job in x]
    assert "holds a token (env GH_TOKEN) where code of a checkout chosen elsewhere runs (" in line


def test_main_reading_the_pr_as_data_with_a_token_passes(tmp_path):
    steps = [
        (f"read {i}", SECRET_ENV + f"        run: {run}\n") for i, run in enumerate(DATA_FORMS)
    ]
    result = plant(tmp_path, {"planted.yml": planted("", *steps)})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("event", NOT_A_MAINTAINERS)
def test_a_self_hosted_job_on_an_event_a_maintainer_does_not_start_is_refused(planted_lines, event):
    (line,) = lines_of(planted_lines, f"on-{event}.yml")
    assert f"job gpu runs on self-hosted and it triggers on {event};" in line


def test_labels_are_matched_as_github_does_case_blind(planted_lines):
    assert "job gpu runs on self-hosted and it triggers" in lines_of(planted_lines, "case.yml")[0]
    assert "job gpu runs on gpu and it triggers" in lines_of(planted_lines, "case-label.yml")[0]


def test_a_pr_workflow_calling_a_remote_reusable_workflow_is_refused(planted_lines):
    (line,) = lines_of(planted_lines, "remote.yml")
    assert "job call calls org/infra/.github/workflows/gpu.yml@" in line


def test_self_hosted_jobs_that_a_maintainer_starts_pass(tmp_path):
    text = "on:\n  push:\n  schedule: [{cron: '0 3 * * *'}]\n  workflow_dispatch:\njobs:"
    result = plant(tmp_path, {"planted.yml": text + GPU_JOB.format(runs_on="[self-hosted, gpu]")})
    assert result.returncode == 0, result.stderr


MALFORMED = [
    "- just a list\n",
    "on: push\njobs: [a, b]\n",
    "on: push\njobs:\n  a: 3\n",
    "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps: {x: 1}\n",
    "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps: [3, [x]]\n",
    "on: [push, {x: 1}]\njobs: {}\n",
    "on: push\njobs:\n  a:\n    uses: 7\n",
]


def test_a_malformed_workflow_is_one_line_never_a_traceback(tmp_path):
    files: dict[str, str | bytes] = {f"bad-{i}.yml": text for i, text in enumerate(MALFORMED)}
    files["binary.yml"] = b"on: push\n\xff\xfe\n"
    result = plant(tmp_path, files)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    for name in files:
        assert len(lines_of(result.stderr.splitlines(), name)) == 1, (name, result.stderr)


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} is not in this environment (the locked CPU venv has it)")
    return str(path)


def test_the_action_passes_the_lints_and_a_planted_interpolation_fails_them(tmp_path):
    """action.yml passes zizmor and the rule; an input spliced into a `run:` fails both."""
    zizmor = [_tool("zizmor"), "--offline", "--min-severity", "low"]
    assert subprocess.run([*zizmor, str(ROOT / "action.yml")], capture_output=True).returncode == 0
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    text = (ROOT / "action.yml").read_text()
    planted = text.replace(
        "run: python -m lockstep.action", 'run: python -m lockstep.action "${{ inputs.script }}"'
    )
    assert planted != text
    (tmp_path / "action.yml").write_text(planted)
    found = subprocess.run([*zizmor, str(tmp_path / "action.yml")], capture_output=True, text=True)
    assert found.returncode != 0 and "template-injection" in found.stdout + found.stderr
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "action.yml: Run lockstep: an expression in run: (pass it through env:)" in result.stderr


def test_actionlint_reads_the_action_through_a_workflow_that_uses_it(tmp_path):
    """The self-test workflow calls `uses: ./`; actionlint checks its inputs against action.yml,
    so a planted input the action does not declare fails."""
    actionlint = [_tool("actionlint"), "-config-file", str(ROOT / ".github" / "actionlint.yaml")]
    selftest = WORKFLOWS / "action-selftest.yml"
    ok = subprocess.run([*actionlint, str(selftest)], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / ".github", repo / ".github")
    shutil.copy(ROOT / "action.yml", repo / "action.yml")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)  # actionlint's project root
    planted = repo / ".github" / "workflows" / "action-selftest.yml"
    planted.write_text(selftest.read_text().replace("check: determinism", "chek: determinism"))
    bad = subprocess.run([*actionlint, str(planted)], cwd=repo, capture_output=True, text=True)
    assert bad.returncode == 1 and '"chek"' in bad.stdout, bad.stdout


# A called workflow's own repository at its own commit (lockstep-gpu.yml's `decide` job): its
# scripts may run with a token in a job that picks an image; any other repository or ref may not.
OWN_REPO = "${{ job.workflow_repository }}"
OWN_SHA = "${{ job.workflow_sha }}"


def own_checkout_job(repository: str, ref: str) -> str:
    return (
        "on: workflow_call\npermissions: {}\njobs:\n  decide:\n    runs-on: ubuntu-24.04\n"
        "    outputs: {image: '${{ steps.d.outputs.image }}'}\n    steps:\n"
        f"      - uses: {CHECKOUT}\n        with:\n          persist-credentials: false\n"
        f"          repository: {repository}\n          ref: {ref}\n          path: lockstep\n"
        f"      - id: d\n{SECRET_ENV}        run: python3 -I lockstep/ci/gpu-pr-gate.py --pr 7\n"
        "  gpu:\n    needs: decide\n    runs-on: ubuntu-24.04\n"
        "    container: {image: '${{ needs.decide.outputs.image }}'}\n"
        "    steps:\n      - run: nvidia-smi\n"
    )


def test_a_called_workflows_own_checkout_may_run_beside_a_token(tmp_path):
    result = plant(tmp_path, {"own.yml": own_checkout_job(OWN_REPO, OWN_SHA)})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("repository", "ref"),
    [("org/other", OWN_SHA), (OWN_REPO, "main"), (OWN_REPO, "${{ inputs.ref }}")],
)
def test_another_repository_or_ref_is_code_chosen_elsewhere(tmp_path, repository, ref):
    result = plant(tmp_path, {"own.yml": own_checkout_job(repository, ref)})
    assert result.returncode == 1
    assert "own.yml: job decide step 2 (d): holds a token (env GH_TOKEN)" in result.stderr
    assert (
        "own.yml: job decide step 2 (d): runs code of a checkout chosen elsewhere" in result.stderr
    )


def test_a_token_planted_in_the_reusable_gpu_job_is_refused(tmp_path):
    """lockstep-gpu.yml's GPU job runs the commit from its checkout on: a token there is refused."""
    text = (WORKFLOWS / "lockstep-gpu.yml").read_text()
    assert text.count("\n    container:\n") == 1
    planted_text = text.replace(
        "\n    container:\n", "\n    env:\n      GH_TOKEN: ${{ github.token }}\n    container:\n"
    )
    result = plant(tmp_path, {"lockstep-gpu.yml": planted_text})
    assert result.returncode == 1
    assert (
        "lockstep-gpu.yml: job gpu step lockstep (a NOT JUDGED fails unless allowed, and is never "
        "a pass): holds a token (job env GH_TOKEN)" in result.stderr
    ), result.stderr
