"""action.yml run end to end without GitHub (`support.composite` runs its steps in order, as a
runner would), on a small user repository made from examples/: lockstep installed by the
action's own install step into the job's Python (whose torch is another version than the
lock's, and stays so), a check that passes, a planted bug that fails, and a gate whose
candidate golden is committed as the summary says and then catches a planted regression."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from support.composite import Runner, Unimplemented, environ_for

ROOT = Path(__file__).resolve().parents[2]
HELD_TORCH = "2.9.1"  # the job's torch as pip sees it, not the lock's


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A job's Python: a venv that sees this environment's packages (torch, the extras) by a
    path entry, but not lockstep, and whose torch metadata says another version."""
    root = tmp_path_factory.mktemp("job")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "job-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    held = site / f"torch-{HELD_TORCH}.dist-info"
    held.mkdir()
    (held / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {HELD_TORCH}\n")
    (held / "INSTALLER").write_text("pip\n")
    (held / "RECORD").write_text("")
    repo = root / "repo"
    repo.mkdir()
    train = (ROOT / "examples" / "train_protocol.py").read_text()
    (repo / "train.py").write_text(train)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "main"], check=True)
    env = environ_for(venv / "bin")
    env.update(PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", OMP_NUM_THREADS="1")
    return venv, repo, env


def run(job, tmp_path, **inputs):
    _, repo, env = job
    runner = Runner(ROOT, repo, tmp_path / "runner-temp", env)
    return runner.run(inputs)


def pip_version(venv: Path, name: str) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         f"import importlib.metadata as m; print(m.version({name!r}))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_a_check_passes_and_the_jobs_torch_stays(job, tmp_path):
    venv, _, _ = job
    result = run(job, tmp_path, command="check", check="determinism", script="train.py",
                 steps="4")  # fmt: skip
    assert not result.failed, result.log
    assert result.outcomes == {"0": "skipped", "1": "success", "run": "success",
                               "3": "success", "4": "skipped"}, result.outcomes  # fmt: skip
    assert result.outputs["verdict"] == "pass" and result.outputs["exit-code"] == "0"
    assert "### lockstep check: PASS" in result.summary
    assert "PASS determinism" in result.summary or "determinism" in result.summary
    assert (result.artifacts / "lockstep-check-0" / "report.json").is_file()
    # the install put lockstep beside the job's packages and held their torch
    assert pip_version(venv, "torch") == HELD_TORCH
    assert pip_version(venv, "lockstep") == "0.1.0"
    held = (tmp_path / "runner-temp" / "lockstep-held.txt").read_text().split()
    assert f"torch=={HELD_TORCH}" in held, held


def test_a_planted_bug_fails_with_exit_1_named_in_the_summary(job, tmp_path):
    _, repo, _ = job
    text = (repo / "train.py").read_text()
    planted = text.replace(
        "torch.manual_seed(0)", "torch.manual_seed(__import__('time').time_ns() % 9973)"
    )
    assert planted != text
    (repo / "planted.py").write_text(planted)
    result = run(job, tmp_path, command="check", check="determinism", script="planted.py",
                 steps="4")  # fmt: skip
    assert result.failed and result.outcomes["run"] == "failure"
    assert result.outputs["verdict"] == "fail" and result.outputs["exit-code"] == "1"
    assert "### lockstep check: FAIL" in result.summary


def readme_workflow() -> dict:
    """README's workflow that gates every pull request (the same block as docs/github-action.md)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks if "/lockstep@v0" in b]
    assert block in (ROOT / "docs" / "github-action.md").read_text()
    assert len(block.splitlines()) <= 15, "the whole workflow a user copies"
    return yaml.safe_load(block)


def test_the_readme_gate_records_a_candidate_then_fails_a_planted_regression(job, tmp_path):
    _, repo, _ = job
    (step,) = [
        s for s in readme_workflow()["jobs"]["gate"]["steps"] if "lockstep@" in s.get("uses", "")
    ]
    gate = step["with"]
    assert gate["command"] == "gate check" and gate["script"] == "train.py"
    first = run(job, tmp_path / "first", **gate)
    assert first.failed and first.outputs["exit-code"] == "2"  # no golden for this runner
    candidate = first.artifacts / "lockstep-golden"
    (golden,) = candidate.rglob("*.json")
    assert golden.parent.name == gate["gate"]
    assert "gh run download 1234 -n lockstep-golden -D gates" in first.summary
    # the commit the summary asks for: the artifact into gates/, then a branch that regresses
    shutil.copytree(candidate, repo / "gates")
    train = repo / "train.py"
    main = train.read_text()
    train.write_text(main.replace("lr=0.05", "lr=0.01"))
    try:
        second = run(job, tmp_path / "second", **gate)
    finally:
        train.write_text(main)
        shutil.rmtree(repo / "gates")
    assert second.failed and second.outputs["verdict"] == "fail", second.log
    assert second.outputs["exit-code"] == "1" and "### lockstep gate check: FAIL" in second.summary
    assert (second.artifacts / "lockstep-check-0" / "junit.xml").is_file()


def test_the_runner_refuses_what_it_does_not_implement(tmp_path):
    runner = Runner(ROOT, tmp_path, tmp_path / "t", {})
    ctx = {"inputs": {}, "github": {}, "runner": {}, "steps": {}, "strategy": {}, "env": {},
           "failed": False}  # fmt: skip
    for text in ("hashFiles('x')", "secrets.TOKEN", "github.event.pull_request.title", "1 < 2"):
        with pytest.raises(Unimplemented):
            runner.evaluate(text, ctx)
    with pytest.raises(Unimplemented, match="does not declare"):
        runner.run({"no-such-input": "x"})


def test_a_not_judged_fails_unless_allowed_by_name_and_is_never_a_pass(tmp_path):
    from lockstep.action import not_judged, verdict

    report = tmp_path / "report.json"
    report.write_text(
        '[{"name": "determinism", "verdict": "pass", "summary": "agree"},'
        ' {"name": "world-size", "verdict": "not_judged", "summary": "BatchNorm without stats"}]'
    )
    parts = not_judged(report, "check")
    assert parts == [("world-size", "BatchNorm without stats")]
    assert verdict(4, parts, ()) == ("not-judged", 4)
    assert verdict(4, parts, ("replicas",)) == ("not-judged", 4)
    assert verdict(4, parts, ("world-size",)) == ("not-judged", 0)  # a warning, not a pass
    assert verdict(4, not_judged(tmp_path / "none.json", "gate ab"), ("x",)) == ("not-judged", 4)
    assert verdict(0, [], ()) == ("pass", 0) and verdict(3, [], ()) == ("error", 3)
