"""`lockstep check NAME CONFIG`: ranks launched through torchrun's launcher API.

What needs new processes runs here: resume in a second launch (at the same and at another
world size: FSDP through DCP, ZeRO through DeepSpeed's universal checkpoint), elastic with a real SIGKILL and a real restart, and an elastic job whose data
order depends on the process, which the restart exposes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from lockstep.cli import main
from support.configs import QUIET_SETS, set_args
from support.inprocess import run_main
from support.teardown_abort import rerun_once_on_abort

ROOT = Path(__file__).resolve().parents[2]
QUIET = set_args("steps=4", *QUIET_SETS)


def pid_ordered_data(seq_len: int, vocab_size: int) -> list[torch.Tensor]:
    """A data factory with a classic bug: its order depends on the process (here its pid)."""
    samples = [(torch.arange(seq_len) * (1 + i % 7) + i) % vocab_size for i in range(64)]
    random.Random(os.getpid()).shuffle(samples)
    return samples


def check(*args: str, tmp_path: Path) -> tuple[int, list[dict], str]:
    out = tmp_path / "result.json"
    argv = ["check", *args, *QUIET, "--out", str(tmp_path / "runs"), "--json", str(out)]

    def launch() -> subprocess.CompletedProcess:
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
        out.unlink(missing_ok=True)
        # the ranks import this module (a data factory): its folder is on their sys.path
        return run_main(argv, ROOT, {"OMP_NUM_THREADS": "1"})

    proc = rerun_once_on_abort(launch, lambda done: done.stdout + done.stderr)
    results = json.loads(out.read_text()) if out.exists() else []
    return proc.returncode, results, proc.stdout + proc.stderr


def test_resume_in_new_processes(tmp_path):
    code, results, log = check("resume", "smoke/cpu-ddp.toml", tmp_path=tmp_path)
    assert code == 0, log
    assert results[0]["passed"] and "bitwise" in results[0]["summary"]


def test_fsdp_resume_on_another_world_size(tmp_path):
    code, results, log = check(
        "resume", "smoke/cpu-fsdp.toml", "--resume-nproc", "1", tmp_path=tmp_path
    )
    assert code == 0, log
    assert "on 1 ranks" in results[0]["summary"] and "rtol=1e-05" in results[0]["summary"]


def test_zero3_resume_on_another_world_size_through_a_universal_checkpoint(tmp_path):
    """2 ranks write a ZeRO-3 checkpoint; 1 rank resumes from DeepSpeed's universal checkpoint
    of it (ds_to_universal), with parameters, optimizer state, LR and data position intact."""
    code, results, log = check(
        "resume", "smoke/cpu-zero3.toml", "--resume-nproc", "1", tmp_path=tmp_path
    )
    assert code == 0, log
    assert "on 1 ranks" in results[0]["summary"], results
    (converted,) = (tmp_path / "runs").rglob("universal/latest_universal")
    assert (converted.parent / "state" / "zero").is_dir()


def test_elastic_sigkill_restart_resume(tmp_path):
    code, results, log = check("elastic", "smoke/cpu-ddp.toml", tmp_path=tmp_path)
    assert code == 0, log
    # The check passes only when the result comes from attempt 1 (TORCHELASTIC_RESTART_COUNT,
    # set by torchelastic's agent when it restarted the group after the kill) resuming at the
    # kill step. Which failure the agent logs first (the killed rank, or rank 0 losing its
    # peer) is a race, so its log lines prove nothing more.
    assert results[0]["passed"] and "SIGKILLed after step 2" in results[0]["summary"]


def test_elastic_catches_a_process_dependent_data_order(tmp_path):
    code, results, log = check(
        "elastic", "smoke/cpu-ddp.toml", "--set", 'data.factory="test_check_cli:pid_ordered_data"',
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, log
    assert results[0]["divergence"]["step"] == 3, results


@pytest.mark.parametrize(
    "args,message",
    [
        (["resume"], "give either a run CONFIG or --script CMD"),
        (["resume", "smoke/cpu-ddp.toml", "--script", "train.py"], "exactly one"),
        (["clip", "--script", "train.py"], "check 'clip' needs a run CONFIG"),
        (["elastic", "smoke/cpu-ddp.toml", "--nproc", "1"], "run it with --nproc 2"),
        (["determinism", "no/such.toml"], "config file not found"),
        (["resume", "smoke/cpu-zero1.toml", "--set", "clip.norm_type=inf"], "norm_type=inf"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
