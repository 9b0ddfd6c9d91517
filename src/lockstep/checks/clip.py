"""The clip check: gradient clipping uses the global norm on every engine, against the unsharded
reference. Design: docs/design/checks.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from lockstep.checks.agreement import combine
from lockstep.checks.harness import (
    check_config,
    first_param_difference,
    numeric_tolerance,
    world_size,
)
from lockstep.checks.reference import run_reference
from lockstep.checks.result import CheckResult, tolerance
from lockstep.checks.state import rows
from lockstep.checks.trajectory import first_divergence
from lockstep.train.config import RunConfig
from lockstep.train.engine_table import ENGINES
from lockstep.train.trainer import Trainer

FORCED_MAX_NORM = 1e-3


class PostClipNorm:
    """The global norm of the gradients the optimizer steps with, after clipping: a step
    pre-hook on the update's optimizer; `take()` combines the ranks' parts."""

    def __init__(self, engine, norm_type: float, device: torch.device):
        optimizer = engine.update_optimizer()
        self.sharded = engine.gradients_sharded
        self.inf = math.isinf(norm_type)
        self.device = device
        self.parts: list[float] = []
        optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                g = g.detach().float()
                self.parts.append(float(g.abs().max() if self.inf else g.pow(2).sum()))

    def take(self) -> float:
        local = max(self.parts, default=0.0) if self.inf else sum(self.parts)
        self.parts.clear()
        total = torch.tensor(local, dtype=torch.float64, device=self.device)
        if self.sharded and dist.is_initialized():
            dist.all_reduce(total, op=dist.ReduceOp.MAX if self.inf else dist.ReduceOp.SUM)
        return float(total) if self.inf else math.sqrt(float(total))


def _clipped_steps(cfg: RunConfig, workdir: Path, steps: int):
    """Each step's row and post-clip norm, and the final parameters."""
    trainer = Trainer(cfg, workdir / "clip")
    try:
        probe = PostClipNorm(trainer.engine, cfg.clip.norm_type, trainer.ctx.device)
        got, post = [], []
        for _ in range(steps):
            got.append(rows([trainer.train_step()])[0])
            post.append(probe.take())
        params = trainer.engine.full_parameters()
    finally:
        trainer.close()
    return got, post, params


def _unclipped(what: str, got: list[dict], post: list[float]) -> CheckResult | None:
    """A failure when a step did not clip, or stepped with more than max_norm."""
    for row, after in zip(got, post, strict=True):
        if not row["grad_norm"] > FORCED_MAX_NORM:
            return CheckResult(
                "clip",
                False,
                f"{what}: step {row['step']} norm {row['grad_norm']!r} is not "
                f"above max_norm {FORCED_MAX_NORM}, so clipping was not exercised",
            )
        if after > FORCED_MAX_NORM * (1 + 1e-4):
            return CheckResult(
                "clip",
                False,
                f"{what}: step {row['step']}: after clipping the optimizer saw a gradient norm "
                f"of {after!r} > max_norm {FORCED_MAX_NORM}",
                diagnosis="the clip coefficient was computed from a local (per-rank) norm "
                "or not applied to every shard",
            )
    return None


def param_atol(cfg: RunConfig, ref_steps: list[dict], atol: float) -> float:
    """How far the engine's parameters may be from the reference's: rounding in fp32; in bf16
    and fp16 twice the learning rates applied (a tiny gradient may take either sign)."""
    if cfg.precision == "fp32":
        return max(atol, 1e-6)
    return max(atol, 2 * sum(float(row["lr"]) for row in ref_steps))


def check_clip(cfg: RunConfig, workdir: Path, steps: int = 2) -> CheckResult:
    """Pre-clip global norm and updated parameters equal the unsharded reference's; the
    post-clip norm is at most max_norm."""
    rtol, atol = numeric_tolerance(cfg)
    cfg = check_config(
        cfg,
        steps=steps,
        clip__max_norm=FORCED_MAX_NORM,
        checkpoint__at_end=False,
        checkpoint__every=0,
        checkpoint__resume="never",
    )
    what = f"{cfg.engine.name}, norm type {cfg.clip.norm_type:g}"
    got, post, params = _clipped_steps(cfg, workdir, steps)
    ref = run_reference(cfg, world_size(), steps)
    unclipped = _unclipped(what, got, post)
    if unclipped is not None:
        return unclipped
    div = first_divergence(ref.steps, got, metrics=("grad_norm", "loss"), rtol=rtol, atol=atol)
    if div is not None:
        return CheckResult(
            "clip",
            False,
            f"{what}: the engine and the unsharded reference diverge at "
            f"{div.describe('reference', cfg.engine.name)}",
            divergence=div,
            diagnosis="the pre-clip gradient norm is not the global norm (a local shard's, "
            "or reduced with the wrong operation)",
        )
    diff = first_param_difference(ref.params, params, rtol, param_atol(cfg, ref.steps, atol))
    if diff:
        return CheckResult(
            "clip",
            False,
            f"{what}: norms match the reference but after {steps} clipped steps the {diff}",
            diagnosis="the clip coefficient applied to the gradients differs from "
            "max_norm / global norm",
        )
    return CheckResult(
        "clip",
        True,
        f"{what}: pre-clip norms {got[0]['grad_norm']:.4g}.. match the unsharded reference "
        f"{tolerance(rtol, atol)}, post-clip norm <= {FORCED_MAX_NORM:g}, parameters match after "
        f"{steps} steps",
    )


def check_clip_norm_types(cfg: RunConfig, workdir: Path) -> CheckResult:
    """`check_clip` for norm type 2 and, on ddp and fsdp, inf."""
    norms = ENGINES[cfg.engine.name].norm_types
    return combine(
        "clip",
        [check_clip(check_config(cfg, clip__norm_type=n), workdir / f"norm-{n:g}") for n in norms],
    )
