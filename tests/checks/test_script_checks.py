"""`lockstep check --script`: the example script passes; each classic bug is caught.

The broken variants are made from examples/train_protocol.py by replacing one line, so the
example docs/scripts.md shows is the very script under test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from support.script_check import EXAMPLE, check, error_lines, planted

BUGS = {
    # a resume that forgets the LR scheduler
    "lr-schedule": ('    sched.load_state_dict(state["sched"])\n', ""),
    # a resume that forgets the RNG state
    "rng": ('    torch.set_rng_state(state["rng"])\n', ""),
    # a resume that forgets the data position
    "data-position": (
        'step, position = state["step"], state["position"]',
        'step = state["step"]',
    ),
    # gradient clipping with a norm computed on this rank's shard of the parameters
    "local-clip": (
        "clip_grad_norm_(model.parameters(), MAX_NORM)",
        "clip_grad_norm_(list(model.parameters())[rank::world], MAX_NORM)",
    ),
    # an unseeded data order
    "unseeded-order": ("random.Random(epoch)", "random.Random()"),
    # a per-rank seed: every rank starts from other weights
    "rank-seed": ("torch.manual_seed(0)", "torch.manual_seed(rank)"),
}


def variant(tmp_path: Path, bug: str) -> Path:
    return planted(tmp_path, bug, [BUGS[bug]])


def test_example_passes_every_check(tmp_path):
    # --run-path: 11 rank processes forked, not started as new interpreters; the new-
    # interpreter launch is what the crash, timeout, first-failing-rank and abort-at-exit tests
    # (a complete run passing, tests/checks/test_script_protocol.py) use
    proc, results = check("all", "--script", str(EXAMPLE), "--run-path", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["check"] for r in results] == ["determinism", "resume", "world-size", "replicas"]
    assert all(r["passed"] for r in results)
    # `all` reuses the fresh 2-rank run: 2 determinism + 2 resume halves + 1 single-rank run
    # + 1 replicas run (every rank logging); 1 and 2 ranks differ by rounding, judged by the
    # noise floor (1 reordered single-rank run) and the float64 replay (both sizes)
    runs = sorted(p.parent.name for p in (tmp_path / "runs").glob("*/run.log"))
    assert len(runs) == 9 and "world-size-1-reordered-1" in runs, runs
    assert "rounding noise" in results[2]["summary"], results[2]
    # the example holds no buffers: its buffer digest covers nothing and is not claimed
    assert "(loss, grad_norm, param_digest)" in results[3]["summary"], results[3]
    assert "the model holds no buffers" in " ".join(results[3]["notes"]), results[3]


@pytest.mark.parametrize(
    ("bug", "name", "cause"),
    [
        # lr differs at the first resumed step; its loss agrees: weights, batch and RNG loaded
        ("lr-schedule", "resume", "the LR schedule was not restored [evidence: "),
        # the first resumed step's loss differs with the LR agreeing; the metrics cannot tell
        # the RNG from the data position (test_resume_evidence.py: the evidence named)
        ("rng", "resume", "the RNG state or data position was not restored (the metrics cannot"),
        ("data-position", "resume", "the RNG state or data position was not restored (the"),
        ("local-clip", "world-size", "clipping or a norm on a local shard"),
        ("unseeded-order", "determinism", "unseeded"),
        # at step 1, before any update: the initial weights first, not clipping
        ("rank-seed", "world-size", "before any update, so the runs start apart: the initial"),
    ],
)
def test_broken_variant_is_caught(tmp_path, bug, name, cause):
    # The resume and determinism bugs do not depend on the world size: one rank is cheaper;
    # so are ranks forked from a process that imported torch (--run-path).
    nproc = "2" if name == "world-size" else "1"
    script = str(variant(tmp_path, bug))
    proc, results = check(name, "--script", script, "--nproc", nproc, "--run-path", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    assert not result["passed"]
    assert result["divergence"]["step"] >= 1
    assert cause in result["diagnosis"]
    assert f"FAIL {name}" in proc.stdout


def test_placeholders_reach_a_script_that_takes_flags(tmp_path):
    wrapper = tmp_path / "flags.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "os.environ.pop('LOCKSTEP_MAX_STEPS'); os.environ.pop('LOCKSTEP_METRICS')\n"
        "os.environ['LOCKSTEP_MAX_STEPS'] = sys.argv[sys.argv.index('--max-steps') + 1]\n"
        "os.environ['LOCKSTEP_METRICS'] = sys.argv[sys.argv.index('--metrics') + 1]\n"
        f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n"
    )
    # filled into the command line alike for forked ranks and new interpreters
    # (`launch.script.script_argv`)
    cmd = f"{wrapper} --max-steps {{max_steps}} --metrics {{metrics}}"
    proc, results = check("determinism", "--script", cmd, "--nproc", "1", "--run-path",
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results[0]["passed"]


@pytest.mark.parametrize("run_path", [(), ("--run-path",)], ids=["new-interpreter", "run-path"])
def test_crashing_script_is_bad_input_in_one_line(tmp_path, run_path):
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('no data found at /nowhere')\n")
    proc, _ = check("determinism", "--script", str(script), "--nproc", "1", *run_path, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "run 'determinism-1' exited 1: no data found at /nowhere" in proc.stderr


@pytest.mark.parametrize("run_path", [(), ("--run-path",)], ids=["new-interpreter", "run-path"])
def test_the_error_quotes_the_rank_that_failed_first(tmp_path, run_path):
    """Rank 0 fails; rank 1 then fails on the closed connection: the one line is rank 0's
    (torchrun's root cause), not rank 1's later "Connection closed by peer"."""
    script = tmp_path / "first.py"
    script.write_text(
        "import torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 0:\n    raise ValueError('rank zero: bad shard at /nowhere')\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    # rank 1's follow-on error must be in the log for the line to be chosen over it; it is
    # there unless torchrun stops rank 1 before it prints (a race under load): then again
    for _ in range(3):
        proc, _ = check("determinism", "--script", str(script), "--nproc", "2", *run_path,
                        cwd=tmp_path, rerun=False)  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        log = (tmp_path / "runs" / "determinism-1" / "run.log").read_text()
        if "Connection closed by peer" in log:  # logged after rank 0's error
            break
    assert "Connection closed by peer" in log, "rank 1's follow-on error never reached the log"
    (line,) = proc.stderr.strip().splitlines()
    assert "ValueError: rank zero: bad shard at /nowhere" in line, line


def test_a_python_on_path_other_than_lockstep_s_is_named(tmp_path):
    """`./venv/bin/lockstep check --script 'python train.py'`, the venv not activated: the
    `python` on PATH has no torch; the error says so instead of blaming the script."""
    import os
    import sys

    other = os.path.realpath(sys.executable)  # the venv's base interpreter: not the venv
    if subprocess.run([other, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{other} imports torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(other)
    (tmp_path / "train.py").write_text("import torch\n")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path)
        proc, _ = check("determinism", "--script", "python train.py", "--nproc", "1",
                        cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "No module named 'torch'" in proc.stderr
    assert f"the `python` on PATH ({bin_dir / 'python'}) is not the interpreter running " \
        f"lockstep ({sys.executable})" in proc.stderr  # fmt: skip


def test_run_path_keeps_the_output_and_the_code_of_os_exit(tmp_path):
    """Under --run-path a script's os._exit(n) ends it as sys.exit(n) (torchelastic's function
    mode needs the rank to return), its output in the run's log."""
    script = tmp_path / "leave.py"
    script.write_text("import os, sys\nprint('leaving from', sys.argv[0])\nos._exit(5)\n")
    proc, _ = check(
        "determinism", "--script", str(script), "--nproc", "1", "--run-path", cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "run 'determinism-1' exited 5" in proc.stderr
    log = (tmp_path / "runs" / "determinism-1" / "run.log").read_text()
    assert f"leaving from {script}" in log
    proc, _ = check(
        "determinism",
        "--script",
        str(script),
        "--launcher",
        "deepspeed",
        "--run-path",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "--run-path is torchrun's" in proc.stderr


def test_run_path_runs_the_atexit_handlers_of_a_script_that_ends_normally(tmp_path):
    """A forked rank ends with os._exit (never through finalization, which tore down the heap
    it forked from), after the atexit handlers a script that returns registered, as its own
    interpreter would run them; after the script's os._exit, none."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import atexit, os\nfrom lockstep import track\n"
        f"atexit.register(lambda: open({str(tmp_path / 'ran')!r}, 'a').write('atexit\\n'))\n"
        "for step in range(1, track.protocol().max_steps + 1):\n"
        "    track.log(step, loss=1.0 / step, grad_norm=0.5 / step)\n"
        "if os.environ.get('LEAVE'):\n    os._exit(0)\n"
    )
    proc, _ = check("determinism", "--script", str(script), "--nproc", "1", "--run-path",
                    cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ran").read_text() == "atexit\n" * 2  # both runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LEAVE", "1")
        proc, _ = check("determinism", "--script", str(script), "--nproc", "1", "--run-path",
                        cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ran").read_text() == "atexit\n" * 2  # none more


def test_script_without_metrics_is_bad_input(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("print('training...')\n")
    proc, _ = check("determinism", "--script", str(script), "--nproc", "1", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no metrics at" in proc.stderr and "LOCKSTEP_METRICS" in proc.stderr


def test_bad_world_sizes_is_usage_error(tmp_path):
    proc, _ = check("world-size", "--script", str(EXAMPLE), "--world-sizes", "2", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--world-sizes" in proc.stderr


@pytest.mark.parametrize("run_path", [(), ("--run-path",)], ids=["new-interpreter", "run-path"])
def test_a_hung_run_is_killed_at_the_timeout_in_one_line(tmp_path, run_path):
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, time\nfrom lockstep import track\n"
        "track.log(1, loss=1.0)\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    proc, _ = check(
        "determinism",
        "--script",
        str(script),
        "--nproc",
        "1",
        "--timeout",
        "5",
        *run_path,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (line,) = error_lines(proc.stderr)  # besides the steps it logged before it hung
    assert "run 'determinism-1' (1 ranks) did not finish within 5 s and was killed" in line
    assert not psutil.pid_exists(int((tmp_path / "pid").read_text()))  # the rank is gone
