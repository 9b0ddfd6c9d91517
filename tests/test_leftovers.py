"""Nothing outlives a command: a signal at a named moment, then no process, worktree or temp
folder left (`lockstep.launch.cleanup`: `launch_scope`, `dying_with_parent`, `KEEP_SESSION`;
`lockstep.gate.ab.run_ab`).

Each case runs `python -m lockstep` with its own TMPDIR, on a script whose ranks write their
pid and sleep: the signal goes to lockstep once every rank is up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from lockstep.launch import run_command

SLEEPER = """\
import os, sys, time
from pathlib import Path
Path(sys.argv[-1], f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
time.sleep(120)
"""


def start(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "marks").mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    return subprocess.Popen([sys.executable, "-m", "lockstep", *args], cwd=cwd or tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)  # fmt: skip


def _ctrl_c_as_in_a_terminal() -> None:
    """lockstep starts with SIGINT's default disposition, as from a terminal: a test run
    started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler, so a Ctrl-C test would
    time out on that set-up and pass on another."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ranks_up(proc: subprocess.Popen, marks: Path, n: int, timeout: float = 120) -> list[int]:
    """The pids of the `n` ranks once each wrote its mark."""
    deadline = time.monotonic() + timeout
    while len(files := sorted(marks.glob("pid-*"))) < n or not all(f.read_text() for f in files):
        if proc.poll() is not None:
            pytest.fail(f"lockstep ended before its ranks started: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{n} ranks did not start within {timeout} s")
        time.sleep(0.1)
    return [int(f.read_text()) for f in files]


def survivors(pids, timeout: float = 15) -> list[int]:
    """Those of `pids` still running after up to `timeout` s (zombies count as ended)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            for pid in alive:  # leave nothing behind, even when the test fails
                os.kill(pid, signal.SIGKILL)
            return alive
        time.sleep(0.1)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"lockstep did not exit after the signal: {proc.communicate()}")
    return proc.returncode, err


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    return f"sleeper.py {tmp_path / 'marks'}"


def test_a_launch_leaves_no_torchelastic_folder_nor_its_signal_handlers(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    log = tmp_path / "run.log"
    fail = [sys.executable, "-c", "raise SystemExit(3)"]  # torchelastic writes an error.json
    assert run_command(fail, 2, log, env=dict(os.environ), timeout=60) == 3
    assert list((tmp_path / "tmp").iterdir()) == []  # no torchelastic_*, no lockstep-launch-*
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # Ctrl-C: KeyboardInterrupt
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_ctrl_c_during_a_run_exits_130_and_ends_every_rank(tmp_path, sleeper, launcher):
    proc = start(tmp_path, "check", "determinism", "--script", sleeper, "--nproc", "2",
                 "--launcher", launcher, "--out", str(tmp_path / "runs"))  # fmt: skip
    pids = ranks_up(proc, tmp_path / "marks", 2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]  # launcher too
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert survivors(pids + tree) == []
    assert (code, err.strip()) == (130, "lockstep: interrupted"), err
    assert list((tmp_path / "tmp").iterdir()) == []
    log = tmp_path / "runs/determinism-1/run.log"
    size = log.stat().st_size
    time.sleep(0.5)
    assert log.stat().st_size == size  # nothing writes into the scrubbed log after


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_ranks_die_with_a_sigkilled_lockstep(tmp_path, sleeper, launcher):
    proc = start(tmp_path, "check", "determinism", "--script", sleeper, "--nproc", "2",
                 "--launcher", launcher, "--out", str(tmp_path / "runs"))  # fmt: skip
    pids = ranks_up(proc, tmp_path / "marks", 2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.kill()
    finish(proc)
    assert survivors(pids + tree) == []


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, timeout=60).stdout  # fmt: skip


def test_sigterm_as_gate_ab_makes_its_temp_folder_leaves_none(tmp_path, monkeypatch):
    """The narrowest moment of the case below, made certain: SIGTERM arrives in the instant
    between the folder's creation and its name reaching the cleanup (the case below, which
    signals as soon as the folder shows, hit it now and then)."""
    from types import SimpleNamespace

    from lockstep.errors import LockstepError
    from lockstep.gate import ab

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f").write_text("x")
    git(repo, "init", "-q")
    git(repo, "add", "f")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    made = tmp_path / "tmp"
    made.mkdir()
    real = tempfile.mkdtemp

    def mkdtemp_then_sigterm(**kwargs):
        folder = real(dir=made, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this returns
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_sigterm)
    monkeypatch.chdir(repo)
    with pytest.raises(LockstepError, match="stopped by SIGTERM"):
        ab.run_ab(SimpleNamespace(run_path=False), "HEAD", 2, 0.05, 0.01, progress=None)
    assert list(made.iterdir()) == []
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


@pytest.mark.parametrize("moment", ["worktree", "first-run"])
def test_sigterm_early_in_gate_ab_removes_its_worktree_and_temp_folder(tmp_path, sleeper, moment):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "sleeper.py").write_text(SLEEPER)
    git(repo, "init", "-q")
    git(repo, "add", "sleeper.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    proc = start(tmp_path, "gate", "ab", "--script", sleeper, "--base", "HEAD", "--rounds",
                 "2", "--nproc", "1", cwd=repo)  # fmt: skip
    pids = []
    if moment == "worktree":  # as soon as its temp folder is there: before or while git works
        deadline = time.monotonic() + 60
        while not any((tmp_path / "tmp").glob("lockstep-ab-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "gate ab made no temp folder"
            time.sleep(0.005)
    else:
        pids = ranks_up(proc, tmp_path / "marks", 1)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert survivors(pids) == []
    assert (code, err.strip().splitlines()[-1]) == (143, "lockstep: error: stopped by SIGTERM")
    assert "Traceback" not in err
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert list((tmp_path / "tmp").iterdir()) == []
