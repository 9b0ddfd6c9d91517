"""The engine interface: one optimizer step with accumulation, clipping and the pre-clip norm;
save and load through the framework's own checkpoint mechanism; full (unsharded) state for
checks that compare engines; the LR schedule's position and the optimizer that applies the
update, for checks that look inside a step. Code outside `lockstep.train.engines` uses only
this interface, so a new engine is one new module here and one row of the engine table
(`lockstep.train.engine_table.ENGINES`)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lockstep.train.config import OptimizerConfig, RunConfig


@dataclass
class Context:
    """Where this rank runs and the batch shape every engine needs."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    micro_size: int
    grad_accum: int


@dataclass
class StepOutcome:
    loss: torch.Tensor  # this rank's mean micro-batch loss, detached, on the device
    grad_norm: float  # global, before clipping (after unscaling under fp16)
    clip_coef: float  # factor applied to the gradients: min(1, max_norm / (norm + 1e-6))
    lr: float  # the learning rate this step used
    loss_scale: float | None  # fp16 only
    skipped: bool  # fp16 overflow: no update this step


def clip_coefficient(norm: float, max_norm: float) -> float:
    if max_norm <= 0 or not math.isfinite(norm):
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


def lr_lambda(cfg: OptimizerConfig, total_steps: int):
    """Linear warmup, then constant, linear or cosine decay to `min_lr_ratio` at the last step."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        done = min(1.0, (step - cfg.warmup_steps) / span)
        shape = 1.0 - done if cfg.schedule == "linear" else 0.5 * (1 + math.cos(math.pi * done))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


class Engine(ABC):
    """One engine wrapping one model. All methods are collective: call them on every rank."""

    name: str
    module: nn.Module  # the user's model (unwrapped), for parameter names
    # True when each rank's `update_optimizer` holds a disjoint shard of the gradients
    # (their norms add up across ranks), False when every rank holds all of them
    gradients_sharded: bool

    def __init__(self, model: nn.Module, cfg: RunConfig, ctx: Context):
        self.cfg = cfg
        self.ctx = ctx
        self.module = model
        if cfg.activation_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                from lockstep.errors import UsageError

                raise UsageError("activation_checkpointing needs a transformers model")
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )

    @abstractmethod
    def step(self, micro_batches: list[torch.Tensor]) -> StepOutcome:
        """Forward/backward every micro batch, reduce, clip, update, advance the LR schedule."""

    @abstractmethod
    def lr(self) -> float: ...

    @abstractmethod
    def lr_schedule_step(self) -> int | None:
        """How often the LR schedule has advanced (the torch scheduler's `last_epoch`); None
        when the schedule does not count that way (a user's DeepSpeed scheduler)."""

    @abstractmethod
    def update_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer whose `step` applies the update, for step hooks: it sees the
        clipped gradients, this rank's shard of them when `gradients_sharded`."""

    @abstractmethod
    def save(self, path: Path, client_state: dict[str, Any]) -> None:
        """Write this engine's state under `path` (a directory every rank can see)."""

    @abstractmethod
    def prepare_load(self, path: Path, saved_world_size: int) -> None:
        """Rank 0 only, before every rank calls `load`: make the checkpoint at `path`, written
        by `saved_world_size` ranks, loadable at this world size (UsageError when it cannot
        be)."""

    @abstractmethod
    def load(self, path: Path, saved_world_size: int) -> dict[str, Any]:
        """Restore from `path`, written by `saved_world_size` ranks; return the client state
        given to `save`."""

    @abstractmethod
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded, fp32, on CPU, keyed by the unwrapped module's names."""

    @abstractmethod
    def full_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per parameter name, the optimizer's tensors (exp_avg, exp_avg_sq, ...), unsharded."""

    def param_names(self) -> list[str]:
        return [n for n, _ in self.module.named_parameters()]

    @abstractmethod
    def close(self) -> None:
        """Release what the framework holds for this engine (not the process group)."""
