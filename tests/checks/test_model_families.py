"""The verdicts read the model: BatchNorm under DDP (buffers compared where DDP promises them
equal), dropout and local-batch BatchNorm in world-size (switched off for the check's runs,
or NOT JUDGED), runs that do not train. On lockstep's reference job (in process, the plugin's
warm ranks) and on a user's script (`cnn_script.py`, launched, ranks forked by --run-path)."""

from pathlib import Path

import pytest

from lockstep.checks.replicas import check_replicas
from lockstep.checks.world_size import check_world_size
from lockstep.train.config import from_dict
from support.configs import QUIET
from support.script_check import check
from support.tiny import TINY

SCRIPT = Path(__file__).with_name("cnn_script.py")
NORMED = {**TINY, "model": {"factory": "support.tiny:normed_model"}}


def run(tmp_path, name: str, flags: str, nproc: str = "2", steps: str = "3"):
    proc, results = check(name, "--script", f"{SCRIPT} {flags}", "--nproc", nproc,
                          "--run-path", cwd=tmp_path, steps=steps)  # fmt: skip
    return proc, (results[0] if results else None)


@pytest.mark.distributed(world_size=2)
def test_reference_job_with_batchnorm_and_dropout_under_ddp(tmp_path):
    cfg = from_dict({"device": "cpu", "steps": 3, "batch": {"micro_size": 2}, **QUIET, **NORMED})
    replicas = check_replicas(cfg, tmp_path)
    assert replicas.passed, replicas.summary
    assert "parameters and buffers" in replicas.summary
    world = check_world_size(cfg, tmp_path)
    assert world.passed, (world.summary, world.diagnosis)
    assert "judged with dropout in drop; BatchNorm in norm switched off" in world.notes, world.notes


@pytest.mark.parametrize("flags", ["--bn", "--bn --inner"], ids=["ddp-wrapper", "inner-module"])
def test_ddp_with_batchnorm_passes_replicas(tmp_path, flags):
    proc, result = run(tmp_path, "replicas", flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "buffer_digest" in result["summary"], result


def test_buffers_never_re_synced_fail_replicas_naming_the_module(tmp_path):
    proc, result = run(tmp_path, "replicas", "--bn --no-broadcast")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (result["divergence"]["step"], result["divergence"]["metric"]) == (2, "buffer_digest")
    assert "entered step 2's forward with other buffers" in result["diagnosis"]
    assert "(first bn1.running_mean, of module bn1)" in result["diagnosis"]
    assert "broadcast_buffers=False" in result["diagnosis"]


@pytest.mark.parametrize(
    ("flags", "kind", "step"),
    [("--lr 0", "no update", 1), ("--no-step", "no update", 1), ("--lr 30", "exploding loss", 2)],
    ids=["lr-0", "no-optimizer-step", "finite-explosion"],
)
def test_a_run_that_does_not_train_fails(tmp_path, flags, kind, step):
    proc, result = run(tmp_path, "replicas", flags)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (result["problem"]["kind"], result["problem"]["step"]) == (kind, step), result


@pytest.mark.parametrize(
    ("flags", "switched"),
    [("--dropout --functional-dropout", "dropout in (model), drop"), ("--bn", "BatchNorm in bn1")],
    ids=["dropout", "batchnorm"],
)
def test_world_size_judges_a_sound_model_with_its_local_batch_parts_switched_off(
    tmp_path, flags, switched
):
    proc, result = run(tmp_path, "world-size", flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(f"judged with {switched} switched off" in n for n in result["notes"]), result


def test_world_size_still_fails_a_loss_normalised_by_the_local_batch(tmp_path):
    proc, result = run(tmp_path, "world-size", "--bn --dropout --sum-loss")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "normalisation bug" in result["diagnosis"], result
    assert "dropout" not in result["diagnosis"], result


def test_world_size_is_not_judged_where_batchnorm_has_no_statistics(tmp_path):
    proc, result = run(tmp_path, "world-size", "--bn --bn-no-stats")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert result["verdict"] == "not_judged"
    assert "BatchNorm in bn1" in result["summary"] and "GroupNorm" in result["summary"]
