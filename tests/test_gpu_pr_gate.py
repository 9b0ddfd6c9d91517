"""ci/gpu-pr-gate.py: a pull request's commit runs on the GPUs only as a maintainer approved it.

The rule runs on GitHub REST answers in their documented shapes (pulls, reviews, collaborator
permission), answered from files through the script's --replay, since nothing here reaches
GitHub. Each case is a way the old label dispatch let a commit through.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "gpu-pr-gate.py"
REPO = "org/lockstep"
HEAD = "a" * 40
OLD = "b" * 40
PERMISSIONS = {"maint": "maintain", "admin1": "admin", "reader": "read", "triager": "triage"}


def review(login: str, state: str, commit: str, at: str) -> dict:
    return {"user": {"login": login}, "state": state, "commit_id": commit, "submitted_at": at}


def api_answers(tmp_path: Path, reviews: list[dict], head: str = HEAD, state: str = "open") -> Path:
    folder = tmp_path / "api"
    folder.mkdir(exist_ok=True)

    def put(path: str, data: object) -> None:
        (folder / (path.replace("/", "_") + ".json")).write_text(json.dumps(data))

    put(
        f"repos/{REPO}/pulls/7",
        {"number": 7, "state": state, "head": {"sha": head}, "user": {"login": "author"}},
    )
    put(f"repos/{REPO}/pulls/7/reviews", reviews)
    for login, level in {**PERMISSIONS, "author": "write"}.items():
        put(f"repos/{REPO}/collaborators/{login}/permission", {"permission": level})
    return folder


def gate(folder: Path, *extra: str, sha: str = HEAD) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), "--repo", REPO, "--pr", "7", "--sha", sha,
         "--replay", str(folder), *extra],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_maintainers_approval_of_the_head_lets_it_run(tmp_path):
    folder = api_answers(tmp_path, [review("maint", "APPROVED", HEAD, "2026-11-01T10:00:00Z")])
    result = gate(folder, "--labeller", "admin1")
    assert result.returncode == 0, result.stderr
    assert "approved by maint" in result.stdout


@pytest.mark.parametrize(
    ("reviews", "head", "state", "labeller", "why"),
    [
        # a push after the approval: the approved commit is no longer the head
        ([review("maint", "APPROVED", OLD, "2026-11-01T10:00:00Z")], HEAD, "open", None, "older commits by maint"),
        # the dispatched commit is not the head now
        ([review("maint", "APPROVED", OLD, "2026-11-01T10:00:00Z")], HEAD, "open", None, "older commits"),
        # approval by someone without write access
        ([review("reader", "APPROVED", HEAD, "2026-11-01T10:00:00Z")], HEAD, "open", None, "no maintainer approved"),
        # the author's own review counts for nothing
        ([review("author", "APPROVED", HEAD, "2026-11-01T10:00:00Z")], HEAD, "open", None, "no maintainer approved"),
        # approved, then the same maintainer asked for changes
        (
            [
                review("maint", "APPROVED", HEAD, "2026-11-01T10:00:00Z"),
                review("maint", "CHANGES_REQUESTED", HEAD, "2026-11-01T11:00:00Z"),
            ],
            HEAD, "open", None, "no maintainer approved",
        ),
        # a labeller with triage rights can label, but not send code to the GPUs
        ([review("maint", "APPROVED", HEAD, "2026-11-01T10:00:00Z")], HEAD, "open", "triager", "triage access"),
        ([review("maint", "APPROVED", HEAD, "2026-11-01T10:00:00Z")], HEAD, "closed", None, "is closed"),
    ],
)  # fmt: skip
def test_everything_else_is_refused_with_why(tmp_path, reviews, head, state, labeller, why):
    folder = api_answers(tmp_path, reviews, head=head, state=state)
    result = gate(folder, *(["--labeller", labeller] if labeller else []))
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("gpu-pr-gate: refused: ") and why in result.stderr


def test_a_dispatched_commit_that_is_not_the_head_is_refused(tmp_path):
    folder = api_answers(tmp_path, [review("maint", "APPROVED", OLD, "2026-11-01T10:00:00Z")])
    result = gate(folder, sha=OLD)
    assert result.returncode == 1 and "is not the head of #7" in result.stderr


@pytest.mark.parametrize("args", [["--sha", "HEAD"], ["--pr", "7;id"], ["--repo", "a b"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    folder = api_answers(tmp_path, [])
    base = {"--repo": REPO, "--pr": "7", "--sha": HEAD}
    base[args[0]] = args[1]
    result = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *[x for kv in base.items() for x in kv],
         "--replay", str(folder)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("answer", ["[" * 100_000, '{"state": "open", "head": 7}', "[1, 2]"])
def test_an_odd_api_answer_is_one_line_and_exit_2(tmp_path, answer):
    folder = api_answers(tmp_path, [])
    (folder / f"repos_{REPO.replace('/', '_')}_pulls_7.json").write_text(answer)
    result = gate(folder)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpu-pr-gate: error: ") and len(result.stderr.splitlines()) == 1
