"""The engine interface: code outside `lockstep.train.engines` uses only this.
Design: docs/design/train.md."""

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
    loss: torch.Tensor  # this rank's mean micro-batch loss, detached
    grad_norm: float  # global, before clipping (unscaled under fp16)
    clip_coef: float
    lr: float  # the one this step used
    loss_scale: float | None  # fp16 only
    skipped: bool  # fp16 overflow: no update


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
    gradients_sharded: bool  # each rank's `update_optimizer` holds a disjoint shard of them

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
        """The torch scheduler's `last_epoch`; None for a schedule that does not count so."""

    @abstractmethod
    def update_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer whose `step` applies the (clipped) update, for step hooks."""

    @abstractmethod
    def save(self, path: Path, client_state: dict[str, Any]) -> None:
        """Write this engine's state under `path`, a directory every rank sees."""

    @abstractmethod
    def prepare_load(self, path: Path, saved_world_size: int) -> None:
        """Rank 0, before `load`: make the checkpoint loadable at this world size, or raise
        UsageError."""

    @abstractmethod
    def load(self, path: Path, saved_world_size: int) -> dict[str, Any]:
        """Restore from `path`; return the client state given to `save`."""

    @abstractmethod
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded, fp32, on CPU, keyed by the unwrapped module's names."""

    @abstractmethod
    def full_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per parameter name, the optimizer's tensors (exp_avg, ...), unsharded."""

    def param_names(self) -> list[str]:
        return [n for n, _ in self.module.named_parameters()]

    @abstractmethod
    def close(self) -> None:
        """Release what the framework holds for this engine (not the process group)."""
