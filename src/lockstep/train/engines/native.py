"""What the PyTorch-native engines (ddp, fsdp) share: torch AdamW, a LambdaLR schedule,
clipping through torch.nn.utils, optional AMP with a grad scaler, and checkpoints through
torch.distributed.checkpoint (model and optimizer, sharded for FSDP)."""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)

from lockstep.train.checkpoint import load_file
from lockstep.train.engines.base import (
    Context,
    Engine,
    StepOutcome,
    autocast_dtype,
    clip_coefficient,
    lr_lambda,
)
from lockstep.train.model import causal_lm_loss

TRAINER_STATE = "trainer_state.pt"


class NativeEngine(Engine):
    def __init__(self, model: nn.Module, cfg, ctx: Context):
        super().__init__(model, cfg, ctx)
        self.amp_dtype = autocast_dtype(cfg.precision)
        self.wrapped = self.wrap(model)
        o = cfg.optimizer
        self.optimizer = torch.optim.AdamW(
            self.wrapped.parameters(),
            lr=o.lr,
            betas=o.betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o, cfg.steps))
        self.scaler = self.make_scaler() if cfg.precision == "fp16" else None

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module: ...

    @abstractmethod
    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager: ...

    @abstractmethod
    def make_scaler(self): ...

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype)

    def step(self, micro_batches: list[torch.Tensor]) -> StepOutcome:
        accum = len(micro_batches)
        losses = []
        for i, batch in enumerate(micro_batches):
            with self.sync_gradients(i == accum - 1):
                with self._autocast():
                    loss = causal_lm_loss(self.wrapped, batch.to(self.ctx.device))
                scaled = loss / accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            losses.append(loss.detach().float())
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.wrapped.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, self.cfg.clip.norm_type)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor holding partial norms
            norm = norm.full_tensor()
        max_norm = self.cfg.clip.max_norm
        if max_norm > 0:
            params = [p for p in self.wrapped.parameters() if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        lr = self.lr()
        skipped = False
        scale = None
        if self.scaler:
            scale = float(self.scaler.get_scale())
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = float(self.scaler.get_scale()) < scale
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        # read only now: a host sync before the optimizer step would wait for the backward
        norm_value = float(norm)
        return StepOutcome(
            loss=torch.stack(losses).mean(),
            grad_norm=norm_value,
            clip_coef=clip_coefficient(norm_value, max_norm),
            lr=lr,
            loss_scale=scale,
            skipped=skipped,
        )

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def lr_schedule_step(self) -> int | None:
        return self.scheduler.last_epoch

    def update_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer

    def save(self, path: Path, client_state: dict[str, Any]) -> None:
        model_sd, optim_sd = get_state_dict(self.wrapped, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path / "dcp"))
        if self.ctx.rank == 0:
            torch.save(
                {
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict() if self.scaler else None,
                    "client": client_state,
                },
                path / TRAINER_STATE,
            )

    def prepare_load(self, path: Path, saved_world_size: int) -> None:
        del path, saved_world_size  # DCP reshards to this world size on its own

    def load(self, path: Path, saved_world_size: int) -> dict[str, Any]:
        del saved_world_size
        model_sd, optim_sd = get_state_dict(self.wrapped, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(
            self.wrapped,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
        extra = load_file(path / TRAINER_STATE)  # weights_only=True, lockstep's allowlist
        self.scheduler.load_state_dict(extra["scheduler"])
        if self.scaler and extra["scaler"]:
            self.scaler.load_state_dict(extra["scaler"])
        return extra["client"]

    def close(self) -> None:
        pass  # torch holds nothing beyond the process group, which the trainer owns

    def full_parameters(self) -> dict[str, torch.Tensor]:
        full = get_model_state_dict(self.wrapped, options=StateDictOptions(full_state_dict=True))
        return {n: full[n].detach().float().cpu().clone() for n in self.param_names()}

    def full_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        full = get_optimizer_state_dict(
            self.wrapped, self.optimizer, options=StateDictOptions(full_state_dict=True)
        )["state"]
        return {
            name: {
                k: torch.as_tensor(v).detach().float().cpu().clone() for k, v in full[name].items()
            }
            for name in self.param_names()
            if name in full
        }
