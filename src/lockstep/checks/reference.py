"""The unsharded single-process reference: a run config trained plainly, with no engine and
no process group.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from lockstep.train.config import RunConfig
from lockstep.train.data import build_stream
from lockstep.train.engines.base import autocast_dtype, clip_coefficient, lr_lambda
from lockstep.train.model import build_model, causal_lm_loss, vocab_size


@dataclass
class ReferenceRun:
    steps: list[dict]  # step, loss, grad_norm (pre-clip), clip_coef, lr
    params: dict[str, torch.Tensor]  # fp32, CPU


def run_reference(
    cfg: RunConfig, world_size: int, steps: int | None = None, watch=None
) -> ReferenceRun:
    """`steps` (default cfg.steps) steps on one process with cfg's global batch; `watch(model,
    optimizer)` returns a recorder whose `end_step` follows every step."""
    device = torch.device("cuda") if cfg.resolved_device() == "cuda" else torch.device("cpu")
    micro, _, global_size = cfg.batch_shape(world_size)
    model = build_model(cfg.model, cfg.seed).to(device)
    stream = build_stream(cfg.data, cfg.seed, vocab_size(model), 0, 1, micro, global_size // micro)
    o = cfg.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, cfg.steps))
    dtype = autocast_dtype(cfg.precision)
    recorder = watch(model, optimizer) if watch is not None else None
    rows = []
    for step in range(1, (steps or cfg.steps) + 1):
        batches = stream.micro_batches()
        losses = []
        for batch in batches:
            cast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
            with cast:
                loss = causal_lm_loss(model, batch.to(device))
            (loss / len(batches)).backward()
            losses.append(float(loss.detach()))
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], cfg.clip.norm_type)
        if cfg.clip.max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.clip.max_norm, norm)
        lr = float(schedule.get_last_lr()[0])
        optimizer.step()
        if recorder is not None:
            recorder.end_step(step, clip_coefficient(float(norm), cfg.clip.max_norm),
                              {n: p.detach() for n, p in model.named_parameters()})  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        rows.append(
            {
                "step": step,
                "loss": sum(losses) / len(losses),
                "grad_norm": float(norm),
                "clip_coef": clip_coefficient(float(norm), cfg.clip.max_norm),
                "lr": lr,
            }
        )
    full = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    return ReferenceRun(rows, full)
