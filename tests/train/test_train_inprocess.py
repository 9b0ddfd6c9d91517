"""`run_training` in-process at world size 1: forced clipping with norm types 2 and inf,
activation checkpointing, a Llama preset, and user model/data factories."""

import math

import pytest
import torch

from lockstep.train.config import from_dict
from lockstep.train.trainer import parameter_digest, run_training
from support import configs
from support.tiny import TINY

QUIET = {**configs.QUIET, "checkpoint": {"at_end": False}}


def config(**sections):
    return from_dict({"device": "cpu", "steps": 3, **QUIET, **sections})


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_forced_clipping_llama_with_activation_checkpointing(tmp_path, norm_type):
    cfg = config(
        model={"preset": "llama-tiny"},
        activation_checkpointing=True,
        clip={"max_norm": 1e-3, "norm_type": norm_type},
    )
    result = run_training(cfg, tmp_path, capture_state=True)
    assert [s.step for s in result.steps] == [1, 2, 3]
    for s in result.steps:
        assert s.grad_norm > 1e-3 and s.clip_coef == pytest.approx(1e-3 / (s.grad_norm + 1e-6))
    assert result.param_digest == parameter_digest(result.params)
    assert result.optimizer_state and all("exp_avg" in v for v in result.optimizer_state.values())
    assert not torch.distributed.is_initialized()  # the group it created is gone


def test_user_factories(tmp_path):
    cfg = config(
        **TINY,
        optimizer={"lr": 0.05},
        steps=6,
    )
    losses = [s.loss for s in run_training(cfg, tmp_path).steps]
    assert losses[-1] < losses[0], losses


def test_existing_process_group_is_joined_and_kept(tmp_path):
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        first = run_training(config(), tmp_path / "a")
        second = run_training(config(), tmp_path / "b")
        assert torch.distributed.is_initialized()
        assert first.param_digest == second.param_digest  # deterministic on CPU
        assert [s.loss for s in first.steps] == [s.loss for s in second.steps]
    finally:
        torch.distributed.destroy_process_group()
