"""`lockstep gate` end to end on a black-box script on 2 gloo ranks (tests/gate/gate_script.py):
record, an unchanged check, a leak that only the outside memory measurement can see, the
reports (JSON, JUnit, step summary, PNG), a missing golden, refresh, and the A/B gate on a
git repository of its own.
"""

import json
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lockstep.cli import main

SCRIPT = Path(__file__).with_name("gate_script.py")
COMMAND = f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))}"
# 6 steps on 2 gloo ranks forked from a process that imported torch (--run-path); the abort
# at exit and the A/B tests launch new interpreters (COMMAND)
JOB = ["--script", str(SCRIPT), "--run-path", "--nproc", 2, "--steps", 6]


def gate(*args) -> int:
    return main(["gate", *map(str, args)])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A golden of the unchanged script: 2 repeats of 6 steps on 2 ranks."""
    folder = tmp_path_factory.mktemp("gates")
    assert gate("record", "demo", *JOB, "--repeats", 2, "--dir", folder) == 0
    (path,) = (folder / "demo").glob("*.json")
    return folder, path


def test_record_writes_a_readable_exact_golden(recorded):
    _, path = recorded
    text = path.read_text()
    data = json.loads(text)
    assert data["repeats"] == 2 and data["job"]["kind"] == "script"
    assert data["env"]["key_fields"]["world_size"] == 2
    assert data["env"]["key_fields"]["torch"].startswith("2.")
    assert path.stem == data["env_key"] and data["env_key"].startswith("cpu-")
    # only what the job uses: this CPU script uses neither DeepSpeed nor torch's CUDA build
    assert "_ds" not in path.stem and "+" not in path.stem, path.stem
    for field in ("config_digest", "lockstep_version", "git_revision", "created", "machine"):
        assert field in data
    assert set(data["fingerprint_digests"]) >= {"torch", "packages", "gpus"}
    assert data["curves"]["loss"]["exact"] and data["curves"]["loss"]["tol_rel"] == 0
    # one line per step, floats written in full
    rows = [line for line in text.splitlines() if line.lstrip().startswith('{"step"')]
    assert len(rows) == 6
    assert data["perf"]["peak_rss_bytes"]["center"] > 50e6  # measured from outside
    assert data["perf"]["step_time_s"]["gated"] and not data["perf"]["wall_s"]["gated"]


def test_unchanged_passes_and_a_leak_fails_on_outside_memory(recorded, tmp_path, monkeypatch):
    folder, _ = recorded
    common = [*JOB, "--dir", folder]
    assert gate("check", "demo", *common) == 0

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GATE_PLANT", "leak")
    out = tmp_path / "report"
    code = gate(
        "check",
        "demo",
        *common,
        "--json",
        out / "r.json",
        "--junit",
        out / "j.xml",
        "--plot",
        out / "plots",
    )
    assert code == 1
    report = json.loads((out / "r.json").read_text())
    failing = {(f["gate"], f["metric"]) for f in report["findings"] if f["status"] == "fail"}
    assert ("perf", "peak_rss_bytes") in failing  # the script logs no memory itself
    assert not [m for g, m in failing if g == "curve"], failing
    suite = ET.parse(out / "j.xml").getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["perf:peak_rss_bytes"].find("failure") is not None
    assert cases["curve:loss"].find("failure") is None
    assert int(suite.get("failures")) == len(failing) and int(suite.get("tests")) == len(cases)
    md = summary.read_text()
    assert "FAILED" in md and "| ❌ | perf | peak_rss_bytes |" in md
    pngs = sorted((out / "plots").glob("*.png"))
    assert {p.name for p in pngs} >= {"demo-loss.png", "demo-lr.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in pngs)


def test_a_nan_run_fails_and_is_never_called_better(recorded, tmp_path, monkeypatch, capsys):
    """The loss NaN from step 4 (written "nan" by `track.log`): it failed, but as "better than
    the golden: if intended, refresh it", inviting a NaN as the new golden."""
    folder, _ = recorded
    monkeypatch.setenv("GATE_PLANT", "nan")
    out = tmp_path / "r.json"
    assert gate("check", "demo", *JOB, "--dir", folder, "--json", out) == 1
    shown = capsys.readouterr().out
    assert "better" not in shown and "loss is nan at step 4 (not a finite number)" in shown
    report = json.loads(out.read_text())
    assert report["verdict"] == "fail" and not report["passed"]
    (loss,) = [f for f in report["findings"] if f["metric"] == "loss"]
    assert loss["status"] == "fail" and loss["step"] == 4 and loss["worse"] is True
    assert "(3 of 6 steps not finite)" in loss["message"]


def test_missing_golden_exits_2_naming_the_nearest_key(recorded, tmp_path, capsys):
    _, path = recorded
    other = tmp_path / "demo" / "cpu-other-key.json"
    other.parent.mkdir()
    data = json.loads(path.read_text())
    data["env"]["key_fields"]["torch"] = "2.12.0"
    other.write_text(json.dumps(data))
    code = gate("check", "demo", "--script", COMMAND, "--nproc", 2, "--steps", 6, "--dir", tmp_path)
    err = capsys.readouterr().err
    assert code == 2
    assert (
        "no golden 'demo' for this environment" in err and "nearest recorded: cpu-other-key" in err
    )
    assert "torch 2.12.0 → " in err and "lockstep gate record demo" in err
    assert len(err.strip().splitlines()) == 1


def test_refresh_shows_what_moves_and_keeps_the_old_file_on_failure(
    recorded, tmp_path, capsys, monkeypatch
):
    _, path = recorded
    folder = tmp_path / "gates"
    (folder / "demo").mkdir(parents=True)
    target = folder / "demo" / path.name
    target.write_text(path.read_text())
    before = target.read_bytes()

    crash = f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)'"
    code = gate(
        "refresh",
        "demo",
        "--script",
        crash,
        "--nproc",
        2,
        "--steps",
        6,
        "--repeats",
        1,
        "--dir",
        folder,
    )
    assert code == 1 and target.read_bytes() == before
    assert "the job exited" in capsys.readouterr().err

    monkeypatch.setenv("GATE_PLANT", "lr")
    assert gate("refresh", "demo", *JOB, "--repeats", 1, "--dir", folder) == 0
    out = capsys.readouterr().out
    assert (
        "lr: max abs change 0.01, max rel change 0.2, 6 of 6 steps changed, first at step 1" in out
    )
    assert json.loads(target.read_text())["repeats"] == 1


def test_refresh_replaces_an_unreadable_golden(recorded, tmp_path, capsys):
    """The advice for a broken golden is `gate refresh`, which used to read the broken file
    first and fail the same way; now it says what was wrong and writes a good one."""
    _, path = recorded
    target = tmp_path / "gates" / "demo" / path.name
    target.parent.mkdir(parents=True)
    target.write_text(path.read_text().replace('"step": 2,', '"step": "two",', 1))
    assert gate("compare", target, tmp_path / "unused.jsonl") == 2
    assert 'rows[1].step is "two", not an integer' in capsys.readouterr().err
    assert gate("refresh", "demo", *JOB, "--repeats", 1, "--dir", tmp_path / "gates") == 0
    captured = capsys.readouterr()
    assert "it replaced an unreadable golden" in captured.out, captured.out
    assert 'rows[1].step is "two"' in captured.out
    assert [row["step"] for row in json.loads(target.read_text())["rows"]] == [1, 2, 3, 4, 5, 6]


def test_the_gloo_abort_at_exit_is_a_note_and_an_abort_mid_run_fails(tmp_path, capsys, monkeypatch):
    """libstdc++'s std::terminate after a complete run (gloo's abort at interpreter exit) counts
    as finished, with a note; the same abort while steps remain fails the job. One rank, 3 steps,
    one repeat: the judgement does not depend on the world size."""
    job = ["--script", COMMAND, "--nproc", 1, "--steps", 3, "--repeats", 1]
    monkeypatch.setenv("GATE_PLANT", "abort-exit")
    assert gate("record", "abort", *job, "--dir", tmp_path / "exit") == 0
    err = capsys.readouterr().err
    assert "died of SIGABRT at interpreter exit" in err and "all 3 steps" in err
    assert list((tmp_path / "exit" / "abort").glob("*.json"))

    # in the middle of the run the abort is the same in a forked rank (--run-path)
    monkeypatch.setenv("GATE_PLANT", "abort-mid")
    mid = ["--script", str(SCRIPT), "--run-path", *job[2:]]
    assert gate("record", "abort", *mid, "--dir", tmp_path / "mid") == 1
    assert "the job exited" in capsys.readouterr().err
    assert not (tmp_path / "mid" / "abort").exists() or not any(
        (tmp_path / "mid" / "abort").iterdir()
    )


AB_SCRIPT = """
import os, time
from lockstep import track
for step in range(1, int(os.environ["LOCKSTEP_MAX_STEPS"]) + 1):
    track.log(step, loss=1.0 / step, step_time_s={step_time})
"""


def test_ab_alternates_base_and_head_trees(tmp_path, monkeypatch):
    """The base logs 0.010 s steps, the working tree 0.012 s: every head round is slower."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (repo / "train.py").write_text(AB_SCRIPT.format(step_time=0.010))
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (repo / "train.py").write_text(AB_SCRIPT.format(step_time=0.012))
    monkeypatch.chdir(repo)
    out = tmp_path / "ab.json"
    command = f"{shlex.quote(sys.executable)} train.py"
    code = gate(
        "ab",
        "--script",
        command,
        "--base",
        "HEAD",
        "--rounds",
        3,
        "--nproc",
        1,
        "--steps",
        4,
        "--alpha",
        0.1,
        "--json",
        out,
    )
    result = json.loads(out.read_text())
    (step,) = [c for c in result["comparisons"] if c["figure"] == "step_time_s"]
    assert step["base"] == [0.010] * 3 and step["head"] == [0.012] * 3
    assert step["ratio"] == pytest.approx(1.2) and step["p_worse"] == pytest.approx(0.05)
    assert step["regression"] and code == 1
    listed = subprocess.run([*git, "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1  # the base worktree is gone


def test_a_golden_recorded_with_run_path_says_so_to_a_check_without(tmp_path, capsys):
    """Forked ranks and new interpreters have different resident sets: a check launched the
    other way than the golden was recorded names it (one rank, 3 steps: one launch each)."""
    job = ["--script", str(SCRIPT), "--nproc", 1, "--steps", 3, "--dir", tmp_path]
    assert gate("record", "how", *job, "--run-path", "--repeats", 1) == 0
    capsys.readouterr()
    gate("check", "how", *job)  # the RSS gate may fail on it: the note says why
    out = capsys.readouterr().out
    assert "the golden was recorded with --run-path, this run is without --run-path" in out


def test_a_reused_workdir_never_resumes_a_previous_run(tmp_path, capsys):
    """A script that resumes whenever its checkpoint folder holds one (no LOCKSTEP_RESUME
    needed), checked twice with one --workdir: the second check starts from step 1 again
    (its folder was emptied, with a line saying so), and a folder holding someone else's
    files is refused, not emptied."""
    source = Path(__file__).parents[2].joinpath("examples", "train_protocol.py").read_text()
    auto = "if proto.resume and ckpt and ckpt.exists():"
    assert source.count(auto) == 1
    script = tmp_path / "train_auto_resume.py"
    script.write_text(source.replace(auto, "if ckpt and ckpt.exists():"))
    job = ["--script", str(script), "--run-path", "--nproc", 1, "--steps", 4]
    gates, work = tmp_path / "gates", tmp_path / "work"
    assert gate("record", "auto", *job, "--repeats", 1, "--dir", gates) == 0
    for attempt in (1, 2):
        report = tmp_path / f"check-{attempt}.json"
        code = gate("check", "auto", *job, "--dir", gates, "--workdir", work, "--json", report)
        err = capsys.readouterr().err
        assert code in (0, 1, 4), err  # speed figures of a 4-step run may be noisy
        findings = json.loads(report.read_text())["findings"]
        curves = [f for f in findings if f["gate"] in ("curve", "window")]
        assert curves and not [f for f in curves if f["status"] != "pass"], findings
    assert f"removed the previous run in {work / 'check'}" in err
    theirs = tmp_path / "theirs"
    (theirs / "check").mkdir(parents=True)
    (theirs / "check" / "notes.txt").write_text("mine")
    assert gate("check", "auto", *job, "--dir", gates, "--workdir", theirs) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("lockstep: error:")]
    assert "holds files that are not a previous gate run's" in line, err
    assert (theirs / "check" / "notes.txt").read_text() == "mine"
