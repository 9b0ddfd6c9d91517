"""Planted hangs in every kind of launch lockstep times out, named from the ranks' flight
recorders (real gloo ranks, torch's own recorder; short timeouts): `lockstep train --nproc`,
`lockstep check NAME CONFIG`, `lockstep preflight --nproc`, a gate job; and the planted kinds
of hang on 2 and 4 real ranks (the pure analysis has them on dumps: test_analysis.py).

A timeout too short for a loaded machine ends the run before the fault is reached; each test
then doubles it (`support.doubling.until`), a few times at most; the time the session's
forkserver takes to import its preload is not counted against it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from lockstep.errors import RankTimeout
from lockstep.launch.script import dumps_folder, launch
from support.doubling import until
from support.inprocess import run_main

ROOT = Path(__file__).resolve().parents[2]
PLANTED = str(Path(__file__).parent / "scripts" / "planted.py")
HELPERS = str(Path(__file__).parent / "scripts" / "helpers.py")
PLANT_SITE = str(ROOT / "tests" / "support" / "plant_site")
STUCK_DATA = ["--set", "data.factory=support.planted_job:dataset"]
REPORT = re.compile(r"\(report: (\S+report\.txt)\)")


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")


def _one_error(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("lockstep: error:")]
    return line


def test_train_timeout_names_the_rank_stuck_in_python(tmp_path):
    """Rank 1's dataset blocks in Python at step 2; rank 0 waits in the next collective."""
    out = tmp_path / "out"
    argv = ["train", str(ROOT / "smoke/cpu-ddp.toml"), "--nproc", "2", "--out", str(out),
            *STUCK_DATA, "--set", "logging.wandb=disabled", "--set", "checkpoint.every=100"]  # fmt: skip

    def attempt(timeout):
        proc = run_main([*argv, "--timeout", str(timeout)], tmp_path, {"PLANT_STUCK": "1:2"})
        return "rank 1 never reached" in proc.stderr, proc

    proc = until(attempt, 5.0)
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = _one_error(proc.stderr)
    assert "2 train ranks did not finish within" in line and "were killed" in line
    assert re.search(r"flight recorder: rank 1 never reached #(\d+) \(last collective #\d+, "
                     r"none pending: in Python\) while rank 0 waits in \w+ #\1", line), line  # fmt: skip
    report = Path(REPORT.search(line).group(1))
    assert report.parent == out / "flight-recorder"
    text = report.read_text()
    assert "rank 1's Python stack:" in text and "planted_job.py" in text and "__getitem__" in text


def test_check_on_a_config_timeout_names_rank_0_on_4_ranks(tmp_path):
    """The culprit is rank 0 (torch's analyzer blames the normal ranks then), on 4 ranks."""
    runs = tmp_path / "runs"
    argv = ["check", "determinism", str(ROOT / "smoke/cpu-ddp.toml"), "--nproc", "4",
            "--out", str(runs), *STUCK_DATA, "--set", "steps=3"]  # fmt: skip

    def attempt(timeout):
        proc = run_main([*argv, "--timeout", str(timeout)], tmp_path, {"PLANT_STUCK": "0:2"})
        return "rank 0 never reached" in proc.stderr, proc

    proc = until(attempt, 8.0)
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = _one_error(proc.stderr)
    assert "4 check ranks did not finish within" in line
    assert re.search(r"flight recorder: rank 0 never reached #(\d+) .*none pending: in Python\) "
                     r"while ranks 1-3 wait in \w+ #\1", line), line  # fmt: skip
    text = Path(REPORT.search(line).group(1)).read_text()
    assert "rank 0's Python stack:" in text and "planted_job.py" in text


def test_preflight_timeout_names_the_rank_stuck_in_python(tmp_path):
    """preflight's ranks time their collectives out themselves; the one that gave up first
    asks every rank for its dump, and the launch adds one line naming the collective."""
    path = os.pathsep.join(filter(None, [PLANT_SITE, os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "PLANT_PREFLIGHT_STUCK": "1", "OMP_NUM_THREADS": "1"}

    def attempt(timeout):
        proc = run_main(["preflight", "--nproc", "2", "--timeout", f"{timeout:g}"], tmp_path, env)
        kept = REPORT.search(proc.stderr)
        text = Path(kept.group(1)).read_text() if kept else ""
        if kept:
            shutil.rmtree(Path(kept.group(1)).parent.parent)  # the launch's temporary folder
        return "never reached" in proc.stderr, (proc, text)

    proc, text = until(attempt, 3.0)  # a rank slower to start than that misses the check-in
    assert proc.returncode == 3, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "flight recorder:" in ln]
    assert line.startswith("lockstep: preflight timed out; flight recorder: rank 1 never "
                           "reached #2 (last collective #1, none pending: in Python) while "
                           "rank 0 waits in all_reduce #2"), line  # fmt: skip
    assert "rank 1's Python stack:" in text and "in _stuck" in text


def test_a_gate_jobs_timeout_names_the_collective(tmp_path):
    from lockstep.gate.job import Job

    def attempt(timeout):
        job = Job(command=f"{PLANTED} hang 1", nproc=2, timeout=timeout, run_path=True)
        with pytest.raises(RankTimeout) as err:
            job.run(tmp_path / f"run-{timeout:g}", progress=lambda *a: None)
        return "all_gather" in str(err.value), str(err.value)

    message = until(attempt, 4.0)
    assert "did not finish within" in message and "\n" not in message
    assert "; flight recorder: " in message
    assert "all_gather (in [4] Float, out [2, 4] Float)" in message
    assert "rank 1: broadcast (in [4] Float)" in message


# ----------------------------------------------------------- the kinds of hang, real ranks


def _hung(mode: str, odd: int, nproc: int, tmp_path: Path, run_path: bool, timeout: float,
          script: str = PLANTED, reached=None):  # fmt: skip
    """The planted fault timed out and read back: (the launch, its report). `reached(report)`:
    the fault itself was recorded (default: some rank out of step), else the timeout doubles
    (`until`)."""
    log = tmp_path / "run.log"

    def attempt(t):
        done = launch([script, mode, str(odd)], nproc, log, env=_env(), timeout=t,
                      run_path=run_path, forensics=dumps_folder(log))  # fmt: skip
        assert done.code is None, log.read_text()[-2000:]  # timed out
        report = done.report()
        # the fault reached: some rank out of step (a loaded machine can time the run out
        # while every rank is still inside an earlier collective: "ranks 0, 1 wait in #3")
        fault = reached(report) if reached else any(f.odd for f in report.findings)
        return len(report.versions) == nproc and fault, (done, report)

    return until(attempt, timeout)


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_rank_in_python_with_no_collective_pending_is_rank_0(tmp_path, nproc):
    _, report = _hung("python", 0, nproc, tmp_path, run_path=True, timeout=3.0)
    # a fresh clone once read "ranks 0, 1 wait in all_reduce #3" at 3, 6 and 12 s: the whole
    # report, for the next time
    assert len(report.findings) == 1, report.text()
    (f,) = report.findings
    others = "rank 1" if nproc == 2 else "ranks 1-3"
    assert f.odd == [0] and f.kind == "in Python", report.text()
    assert f.headline == (f"rank 0 never reached #5 (last collective #4, none pending: in "
                          f"Python) while {others} {'waits' if nproc == 2 else 'wait'} in "
                          "all_reduce #5")  # fmt: skip
    assert "in <module>" in f.stacks[0] and "planted.py" in f.stacks[0]


def test_a_new_interpreter_on_4_ranks_blocked_in_gloo_is_named(tmp_path):
    """Not --run-path: nothing of lockstep runs in the ranks but what it put there."""
    _, report = _hung("hang", 3, 4, tmp_path, run_path=False, timeout=10.0)
    (f,) = report.findings
    assert f.odd == [3] and f.seq == 2, report.text()
    assert f.headline.startswith("rank 3 entered broadcast #2 while ranks 0-2 wait in "
                                 "all_gather #2"), f.headline  # fmt: skip
    assert "dist.broadcast(t, 0)" in Path(PLANTED).read_text()
    assert 'planted.py", line' in f.stacks[3]


def test_helpers_a_rank_starts_leave_the_dump_of_a_hang_alone(tmp_path):
    """Two new interpreters blocked in gloo, each rank in another collective: nothing of
    lockstep runs in them unless lockstep put it there (sitecustomize). Each rank starts a
    helper interpreter that imports torch and exits after its rank dumped, and one that
    crashes (it made every rank dump at once, before the hang): the dumps record the hang
    (scripts/helpers.py)."""
    # reached once rank 1 is in its broadcast: on a loaded machine its helpers can still be
    # starting when a short timeout fires ("rank 1 never reached #2 ... in Python")
    done, report = _hung("hang", 1, 2, tmp_path, run_path=False, timeout=8.0, script=HELPERS,
                         reached=lambda report: "rank 1: broadcast" in report.text())  # fmt: skip
    text = report.text()
    (f,) = report.findings
    assert f.seq == 2 and f.odd == [0, 1], text  # two ranks, two collectives: no majority
    assert "rank 0: all_gather (in [4] Float, out [2, 4] Float)" in text
    assert "rank 1: broadcast (in [4] Float)" in text
    lines = Path(HELPERS).read_text().splitlines()
    for call in ("dist.broadcast(t, 0)", "dist.all_gather(out, t)"):  # each rank's stack
        line = next(i for i, ln in enumerate(lines, 1) if ln.strip().startswith(call))
        assert f'helpers.py", line {line} in <module>' in text
    assert report.versions == {0: "2.10", 1: "2.10"}
    assert "rank 1: broadcast" in done.hang_report()


@pytest.mark.parametrize(("nproc", "odd"), [(2, 1), (4, 0)])
def test_a_rank_that_skips_a_collective_is_named(tmp_path, nproc, odd):
    """Forked ranks blocked in gloo (new interpreters: the tests above): rank ODD skipped
    all_reduce #5 and waits in the all_gather after it; on 4 ranks the culprit is rank 0
    (torch's analyzer blames others)."""
    _, report = _hung("skip", odd, nproc, tmp_path, run_path=True, timeout=6.0)
    (f,) = report.findings
    others = {2: "rank 0 waits", 4: "ranks 1-3 wait"}[nproc]
    assert f.odd == [odd] and f.kind == "skipped" and f.seq == 5, report.text()
    assert f.headline.startswith(f"rank {odd} skipped all_reduce #5: entered all_gather, the "
                                 f"collective after it while {others} in all_reduce #5"), f.headline  # fmt: skip
    assert 'planted.py", line' in f.stacks[odd]


@pytest.mark.parametrize(("nproc", "odd"), [(2, 0), (4, 3)])
def test_sizes_that_differ_name_collective_seq_and_rank(tmp_path, nproc, odd):
    """Rank ODD all_reduces 8 floats where the others 4. On 2 ranks gloo aborts the other
    rank (SIGABRT, no dump: its sizes come from gloo's message in the log); on 4 every rank
    raises and dumps."""
    log = tmp_path / "run.log"
    done = launch([PLANTED, "size", str(odd)], nproc, log, env=_env(), timeout=120,
                  run_path=True, forensics=dumps_folder(log))  # fmt: skip
    assert done.code not in (0, None)
    cause = done.cause([], 1)
    if nproc == 2:
        assert re.search(r"flight recorder: rank 1's all_reduce #2 differs in size: rank 1 "
                         r"aborted in gloo: received \d+ bytes where its own call expected "
                         r"\d+ .*; rank 0 entered all_reduce #2 with \[8\] Float", cause), cause  # fmt: skip
    else:
        assert ("flight recorder: rank 3 entered all_reduce #2 with [8] Float while ranks 0-2 "
                "entered all_reduce #2 with [4] Float") in cause, cause  # fmt: skip


def test_a_rank_gloo_aborted_when_the_others_went_on_is_named_at_their_last(tmp_path):
    """No rank waits (rank 0 finished its all_reduce #5, gloo let the smaller message through)
    and rank 1 died of SIGABRT without a dump: the last collective rank 0 entered is named,
    with the sizes gloo's message gives for rank 1 (torchrun's summary and gloo's line, as the
    launch's log has them)."""
    from lockstep.forensics import hang
    from support.flight_recorder import dump, pickled

    (tmp_path / "rank_0").write_bytes(pickled(dump(2, HISTORY_5, completed=5)))
    log = (
        "op.preamble.length <= op.nbytes. 32 vs 16. Received data size doesn't match expected "
        "size.\nFatal Python error: Aborted\n" + "=" * 60 + "\nFailures:\n  <NO_OTHER_FAILURES>\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : now\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 7)\n" + "=" * 60 + "\n"
    )
    report = hang.report(tmp_path, log, world=2)
    (f,) = report.findings
    assert f.odd == [1] and f.seq == 5 and f.kind == "sizes differ"
    assert f.headline == (
        "rank 1's all_reduce #5 differs in size: rank 1 aborted in gloo: received 32 bytes where "
        'its own call expected 16 ("Received data size doesn\'t match expected size"); rank 0 '
        "entered all_reduce #5 with [4] Float"
    )
    assert report.no_dump == []


HISTORY_5 = ["all_reduce", "all_gather", "all_reduce", "all_gather", "all_reduce"]
