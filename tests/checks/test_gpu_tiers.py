"""The GPU tiers. `smoke` (`nox -s smoke`): one GPU, each engine in bf16, short runs with
determinism, resume and clip. `multi_gpu` (`nox -s multi_gpu`): every local GPU, ZeRO-1/2/3
and FSDP with resume, clip, equivalence and a world-size change.

Without the GPUs each test is skipped by the distributed plugin with the reason ("needs N
GPUs (gpus=True), found M"); nothing here pretends to have run.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lockstep.checks import noise_floor as nf
from lockstep.checks.clip import check_clip_norm_types
from lockstep.checks.determinism import check_determinism
from lockstep.checks.divergence_replay import trainer_side
from lockstep.checks.equivalence import check_equivalence
from lockstep.checks.resume import check_resume
from lockstep.train.config import load_config
from support.configs import QUIET_SETS, assert_passed

SMOKE = Path(__file__).resolve().parents[2] / "smoke"
GPUS = max(2, torch.cuda.device_count())
SHORT = ["steps=6", *QUIET_SETS]


def gpu_config(engine: str, *overrides: str):
    return load_config(SMOKE / f"gpu-{engine}.toml", [*SHORT, *overrides])


@pytest.mark.smoke
@pytest.mark.distributed(world_size=1, gpus=True, timeout=600)
@pytest.mark.parametrize("engine", ["ddp", "fsdp", "zero1", "zero2", "zero3"])
def test_smoke_bf16(engine, tmp_path):
    cfg = gpu_config(engine)
    assert cfg.precision == "bf16"
    for check in (check_determinism, check_resume, check_clip_norm_types):
        assert_passed(check(cfg, tmp_path / check.__name__))


@pytest.mark.smoke
@pytest.mark.distributed(world_size=1, gpus=True, timeout=300)
@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_the_noise_floor_is_not_zero_on_a_gpu(engine, tmp_path):
    """In fp32 on a GPU the intra-op thread count moves no kernel: `noise_floor.reordered`
    must reorder the GPU's own sums (the other BLAS library), or every engine and world-size
    difference the multi-GPU tier finds would be NOT JUDGED. A rerun stays bitwise."""
    side = trainer_side(gpu_config(engine, 'precision="fp32"', "steps=4"))
    _, rows = side(4, None, tmp_path / "plain")
    _, again = side(4, None, tmp_path / "again")
    assert nf.measure(rows, [again]).largest() == 0, "a rerun on the GPU is not bitwise"
    with nf.reordered():
        _, reordered = side(4, None, tmp_path / "reordered")
    floor = nf.measure(rows, [reordered])
    assert 0 < floor.largest() < 1e-3, floor


@pytest.mark.multi_gpu
@pytest.mark.distributed(world_size=GPUS, gpus=True, timeout=600)
@pytest.mark.parametrize("engine", ["fsdp", "zero1", "zero2", "zero3"])
def test_multi_gpu_resume_and_clip(engine, tmp_path):
    cfg = gpu_config(engine, "batch.micro_size=4")
    for check in (check_resume, check_clip_norm_types):
        assert_passed(check(cfg, tmp_path / check.__name__))


@pytest.mark.multi_gpu
@pytest.mark.distributed(world_size=GPUS, gpus=True, timeout=600)
def test_multi_gpu_equivalence(tmp_path):
    # fp32 on GPU: the engines are compared, not bf16 rounding
    assert_passed(check_equivalence(gpu_config("fsdp", 'precision="fp32"'), tmp_path))


@pytest.mark.multi_gpu
@pytest.mark.parametrize("engine", ["fsdp", "zero3"])
def test_multi_gpu_world_size_change(engine, tmp_path):
    """Ranks 1 and all GPUs on the same global batch, each against the unsharded reference,
    through `lockstep check world-size` (one launch per world size)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    n = torch.cuda.device_count()
    cmd = [sys.executable, "-m", "lockstep", "check", "world-size", str(SMOKE / f"gpu-{engine}.toml"),
           "--nproc", str(n), "--world-sizes", f"1,{n}", "--set", 'precision="fp32"',
           "--set", "batch.micro_size=4", *[a for s in SHORT for a in ("--set", s)]]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
