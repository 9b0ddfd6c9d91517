"""zero1, zero2, zero3: the DeepSpeed engine, configured from the run config (or the user's
ds_config.json), checkpointed with its own save_checkpoint/load_checkpoint."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lockstep import compat
from lockstep.errors import UsageError
from lockstep.train import deepspeed_config
from lockstep.train.engines.base import Context, Engine, StepOutcome, clip_coefficient, lr_lambda
from lockstep.train.model import causal_lm_loss

TAG = "state"
UNIVERSAL = "universal"
CONVERT_TIMEOUT_S = 1800
OPTIMIZER_KEYS = ("exp_avg", "exp_avg_sq")


def _adam_ops_prebuilt() -> bool:
    """DeepSpeed installed with its Adam ops built (DS_BUILD_OPS=1): nothing is JIT-built."""
    from deepspeed.git_version_info import installed_ops

    return bool(installed_ops.get("fused_adam") and installed_ops.get("cpu_adam"))


class ZeroEngine(Engine):
    gradients_sharded = True  # every ZeRO stage partitions the fp32 gradients it steps with

    def __init__(self, model: nn.Module, cfg, ctx: Context):
        super().__init__(model, cfg, ctx)
        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
        self.name = cfg.engine.name
        device = ctx.device.type
        problem = deepspeed_config.arch_list_problem(os.environ.get("TORCH_CUDA_ARCH_LIST"))
        if device == "cuda" and problem and not _adam_ops_prebuilt():
            raise UsageError(problem)
        if cfg.engine.ds_config:
            ds = deepspeed_config.load_user_config(cfg, ctx.world_size, model)
            ds.setdefault(
                "optimizer", deepspeed_config.generate(cfg, ctx.world_size, device)["optimizer"]
            )
        else:
            ds = deepspeed_config.generate(cfg, ctx.world_size, device, model)
        self.ds_config = ds
        schedule = None
        if "scheduler" not in ds:
            schedule = lambda opt: torch.optim.lr_scheduler.LambdaLR(  # noqa: E731
                opt, lr_lambda(cfg.optimizer, cfg.steps)
            )
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            lr_scheduler=schedule,
            config=ds,
            dist_init_required=False,
        )
        self.fp16 = self.engine.fp16_enabled()

    def step(self, micro_batches: list[torch.Tensor]) -> StepOutcome:
        losses = []
        lr = self.lr()
        skipped_before = self.engine.skipped_steps
        scale = float(self.engine.optimizer.cur_scale) if self.fp16 else None
        for batch in micro_batches:
            loss = causal_lm_loss(self.engine, batch.to(self.ctx.device))
            self.engine.backward(loss)
            self.engine.step()
            losses.append(loss.detach().float())
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else float("nan")
        return StepOutcome(
            loss=torch.stack(losses).mean(),
            grad_norm=norm,
            clip_coef=clip_coefficient(norm, self.cfg.clip.max_norm),
            lr=lr,
            loss_scale=scale,
            skipped=self.engine.skipped_steps > skipped_before,
        )

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def lr_schedule_step(self) -> int | None:
        return getattr(self.engine.lr_scheduler, "last_epoch", None)

    def update_optimizer(self) -> torch.optim.Optimizer:
        return self.engine.optimizer.optimizer  # the torch optimizer inside ZeRO's wrapper

    def close(self) -> None:
        self.engine.destroy()

    def save(self, path: Path, client_state: dict[str, Any]) -> None:
        self.engine.save_checkpoint(
            str(path / "deepspeed"),
            tag=TAG,
            client_state={"lockstep": client_state},
            save_latest=False,
        )

    def prepare_load(self, path: Path, saved_world_size: int) -> None:
        if saved_world_size != self.ctx.world_size:
            universal_checkpoint(path)

    def load(self, path: Path, saved_world_size: int) -> dict[str, Any]:
        """DeepSpeed's own checkpoint, or at another world size the universal one that
        `prepare_load` made beside it."""
        universal = saved_world_size != self.ctx.world_size
        config = compat.deepspeed_engine_config(self.engine)  # read at load time only
        config.load_universal_checkpoint = universal
        try:
            loaded, client = self.engine.load_checkpoint(
                str(path / (UNIVERSAL if universal else "deepspeed")),
                tag=TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        finally:
            config.load_universal_checkpoint = False
        if loaded is None or "lockstep" not in (client or {}):
            raise UsageError(f"checkpoint {path}: DeepSpeed could not load it; it is incomplete")
        return client["lockstep"]

    def _full(self, param: nn.Parameter, key: str | None) -> torch.Tensor:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        full = (
            safe_get_full_fp32_param(param)
            if key is None
            else safe_get_full_optimizer_state(param, key)
        )
        if full is None and key is None:  # not partitioned by ZeRO: the module holds it whole
            full = param.data
        return full.detach().float().cpu().clone() if full is not None else None

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {n: self._full(p, None) for n, p in self.engine.module.named_parameters()}

    def full_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        # ZeRO-1/2 link parameters to optimizer-state fragments at the first step, which has
        # not come yet after a load_checkpoint: link them now (DeepSpeed's own hook)
        link = getattr(self.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None and getattr(self.engine.optimizer.optimizer, "state", None):
            link()
        out = {}
        for name, p in self.engine.module.named_parameters():
            state = {k: self._full(p, k) for k in OPTIMIZER_KEYS}
            out[name] = {k: v for k, v in state.items() if v is not None}
        return out


def universal_checkpoint(path: Path) -> Path:
    """DeepSpeed's universal checkpoint of `path` (made once, by DeepSpeed's own ds_to_universal,
    into path/universal), which loads at any world size. Call on one rank."""
    out = path / UNIVERSAL
    if (out / "latest_universal").is_file():
        return out
    tmp = path / f".tmp-{UNIVERSAL}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(path / "deepspeed" / TAG),
        "--output_folder",
        str(tmp / TAG),
        "--inject_missing_state",  # lockstep's models carry no parallelism layout to record
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"checkpoint {path}: converting to a universal checkpoint took over "
            f"{CONVERT_TIMEOUT_S} s; resume on the world size that wrote it"
        ) from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise UsageError(
            f"checkpoint {path}: DeepSpeed's ds_to_universal failed "
            f"({lines[-1] if lines else f'exit {done.returncode}'}); resume on the world size "
            "that wrote it"
        )
    try:
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(
            f"checkpoint {path}: cannot publish its universal checkpoint ({exc}); "
            "make the checkpoint directory writable"
        ) from None
    return out
