"""The tolerant protocol of `lockstep check --script`, on variants of examples/train_protocol.py:
loops that overshoot LOCKSTEP_MAX_STEPS, periodic checkpoints before or after the step, resumes
that restart at step 1 or skip a step, the gloo abort at exit (tolerated after a complete run,
an error mid-run), the replicas check and its planted bugs, and the deepspeed launcher.

Resume and determinism cases run on one rank (cheaper: the protocol does not depend on the
world size); replicas need two. Those run with --run-path (ranks forked from a process that
imported torch), the abort in the middle of a run too; the abort at exit needs a script that
ends through Python's finalization, in its own interpreter, and the deepspeed launcher starts
its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.script_check import check, error_lines, planted

LOOP = "while step < (proto.max_steps or 20):\n"
LOG = "    track.log(step, loss=loss / world, grad_norm=grad_norm, lr=lr, model=model)\n"
FINAL_SAVE = "\nsave()\ntrack.finish()"
# The real std::terminate of libstdc++ (its message, then abort()); registered as a C atexit
# handler it runs after Python's finalization, like the gloo abort (no Python frame).
TERMINATE = (
    "import ctypes\n"
    "_cxx = ctypes.CDLL('libstdc++.so.6')\n"
    "_fn = ctypes.cast(_cxx._ZSt9terminatev, ctypes.c_void_p)\n"
)

VARIANTS = {
    # `while` that tests after the step: one step past the limit, saved there
    "overshoot": [(LOOP, "while step <= (proto.max_steps or 20):\n")],
    # a checkpoint every 3 steps at the top of the loop, before that iteration's step
    "every-3-before": [
        (LOOP, LOOP + "    if step % 3 == 0 and step > 0:\n        save()\n"),
        (FINAL_SAVE, "\ntrack.finish()"),
    ],
    # a checkpoint every 3 steps after the step
    "every-3-after": [
        (LOG, LOG + "    if step % 3 == 0:\n        save()\n"),
        (FINAL_SAVE, "\ntrack.finish()"),
    ],
    # a resume that restores everything but the step counter: it starts again at step 1
    "restart-at-1": [
        ('step, position = state["step"], state["position"]', 'position = state["position"]')
    ],
    # the step counter restored one lower than the state: it replays one step late
    "one-step-late": [
        (
            'step, position = state["step"], state["position"]',
            'step, position = state["step"] - 1, state["position"]',
        )
    ],
    # no LR logged, and the RNG state not restored: the first step after the resume differs
    "no-lr-rng-lost": [
        ("grad_norm=grad_norm, lr=lr,", "grad_norm=grad_norm,"),
        ('    torch.set_rng_state(state["rng"])\n', ""),
    ],
    # an off-by-one when restoring the step counter: one step is skipped
    "skip-a-step": [
        (
            'step, position = state["step"], state["position"]',
            'step, position = state["step"] + 1, state["position"]',
        )
    ],
    # std::terminate at process exit, after a complete run and its checkpoint (a script that
    # ends through Python's finalization, not track.finish)
    "abort-at-exit": [
        (
            "from lockstep import track\n",
            "from lockstep import track\n\n"
            + TERMINATE
            + "ctypes.CDLL(None).__cxa_atexit(_fn, None, None)\n",
        ),
        ("track.finish()", "dist.barrier()\ndist.destroy_process_group()"),
    ],
    # std::terminate in the middle of the run
    "abort-mid-run": [
        ("from lockstep import track\n", "from lockstep import track\n\n" + TERMINATE),
        (LOG, LOG + "    if step == 2:\n        ctypes.CFUNCTYPE(None)(_fn.value)()\n"),
    ],
    # replicas: BatchNorm running statistics updated from each rank's batch, never broadcast
    "batchnorm-buffers": [("torch.nn.Tanh()", "torch.nn.BatchNorm1d(32), torch.nn.Tanh()")],
    # replicas: a rank-dependent seed for the augmentation noise, set before the model is built
    "rank-seed": [("torch.manual_seed(0)", "torch.manual_seed(rank)")],
    # replicas: the last parameter left out of the hand-written gradient averaging
    "unaveraged-param": [
        (
            "for p in model.parameters():  # average",
            "for p in list(model.parameters())[:-1]:  # average",
        )
    ],
    # the deepspeed CLI passes --local_rank; a script written for it parses it
    "deepspeed-cli": [
        (
            "proto = track.protocol()\n",
            "proto = track.protocol()\nimport argparse\n"
            "_args = argparse.ArgumentParser()\n"
            "_args.add_argument('--local_rank', type=int, required=True)\n"
            "_args.parse_args()\n",
        ),
    ],
}


def variant(tmp_path: Path, name: str) -> str:
    return str(planted(tmp_path, name, VARIANTS[name]))


@pytest.mark.parametrize(
    ("name", "summary"),
    [
        ("overshoot", "steps 6..8 after a resume at step 5"),
        ("every-3-before", "steps 4..8 after a resume at step 3"),
        ("every-3-after", "steps 4..8 after a resume at step 3"),
    ],
)
def test_resume_accepts_real_loops(tmp_path, name, summary):
    script = variant(tmp_path, name)
    proc, results = check(
        "resume", "--script", script, "--nproc", "1", "--run-path", steps="8", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary in results[0]["summary"], results
    # piped, the verdict is one line however long (rich wrapped it at 80 columns), and each
    # run's progress is on stderr only, never in stdout or the JSON report
    assert f"PASS resume: {results[0]['summary']}" in proc.stdout.splitlines(), proc.stdout
    for run in ("resume-straight", "resume-first-half", "resume-second-half"):
        assert f"lockstep: {run}: step " in proc.stderr, proc.stderr
    last = 9 if name == "overshoot" else 8  # its loop logs one step past the limit
    assert f"lockstep: resume-straight: step {last}/8" in proc.stderr.splitlines(), proc.stderr
    assert "/8" not in proc.stdout and f"step {last}/8" not in json.dumps(results)
    if name == "overshoot":
        assert "logged step 9 past LOCKSTEP_MAX_STEPS=8; ignored" in proc.stdout
        assert "logged step 5 past LOCKSTEP_MAX_STEPS=4; ignored" in results[0]["notes"][1]


@pytest.mark.parametrize(
    ("name", "summary", "cause"),
    [
        # model, optimizer and data were loaded: only the step counter was not
        ("restart-at-1", "started again at step 1", "the checkpoint of step 2 was loaded"),
        ("skip-a-step", "step 3 was skipped", "one step early: its step k is the straight"),
        ("one-step-late", "diverges at step 2", "one step late: its step k is the straight"),
        ("no-lr-rng-lost", "diverges at step 3", "the script logs no LR"),
    ],
)
def test_resume_still_catches_a_bad_step_counter(tmp_path, name, summary, cause):
    script = variant(tmp_path, name)
    proc, results = check("resume", "--script", script, "--nproc", "1", "--run-path", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert summary in results[0]["summary"] and cause in results[0]["diagnosis"], results
    # the likely cause says only what the runs' metrics show
    assert "no checkpoint was loaded" not in results[0]["diagnosis"]
    assert "LR matches" not in results[0]["diagnosis"]


def test_abort_at_exit_after_a_complete_run_is_a_warning(tmp_path):
    script = variant(tmp_path, "abort-at-exit")
    proc, results = check(
        "determinism", "--script", script, "--nproc", "1", cwd=tmp_path, rerun=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results[0]["passed"]
    assert len(results[0]["notes"]) == 2  # both runs aborted, both were complete
    assert "terminate called without an active exception" in results[0]["notes"][0]
    log = (tmp_path / "runs" / "determinism-1" / "run.log").read_text()
    assert "exitcode  : -6" in log and "SIGABRT" in log  # a real abort, at exit


def test_abort_mid_run_stays_an_error(tmp_path):
    script = variant(tmp_path, "abort-mid-run")
    proc, _ = check("determinism", "--script", script, "--nproc", "1", "--run-path", cwd=tmp_path,
                    rerun=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(error_lines(proc.stderr)) == 1
    assert "lockstep: determinism-1: step 2/4" in proc.stderr  # how far it went, as it went
    assert "SIGABRT" in proc.stderr and "while the script was running" in proc.stderr
    assert "logged steps 1..2 of 1..4" in proc.stderr


@pytest.mark.parametrize(
    ("name", "quantity", "step", "cause"),
    [
        # the example itself passes: tests/checks/test_script_checks.py, in its `check all`
        # (buffers are compared as a step's forward enters the model: equal at step 1's, the
        # statistics of each rank's own batch at step 2's, nothing re-syncing them)
        ("batchnorm-buffers", "buffer_digest", 2, "never re-synced across ranks"),
        ("rank-seed", "param_digest", 1, "started from different weights"),
        ("unaveraged-param", "grad_norm", 1, "left out of the all-reduce"),
    ],
)
def test_replicas(tmp_path, name, quantity, step, cause):
    script = variant(tmp_path, name)
    proc, results = check("replicas", "--script", script, "--run-path", cwd=tmp_path)
    (result,) = results
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (result["divergence"]["step"], result["rank"]) == (step, 1), result
    assert result["divergence"]["metric"] == quantity, result
    assert cause in result["diagnosis"]
    assert f"rank 1 departed from rank 0 at step {step}" in proc.stdout


def test_deepspeed_launcher_passes_local_rank(tmp_path):
    script = variant(tmp_path, "deepspeed-cli")
    proc, results = check("replicas", "--script", script, "--launcher", "deepspeed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results[0]["passed"]
    proc, _ = check("replicas", "--script", script, "--run-path", cwd=tmp_path)  # no --local_rank
    assert proc.returncode == 2 and "--local_rank" in proc.stderr
