"""ddp: torch DistributedDataParallel; accumulation skips the all-reduce with `no_sync`, and a
resume primes DDP's buckets (`prime_buckets`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lockstep.train.engines.native import NativeEngine
from lockstep.train.model import causal_lm_loss


class DDPEngine(NativeEngine):
    name = "ddp"
    gradients_sharded = False

    def wrap(self, model: nn.Module) -> nn.Module:
        model.to(self.ctx.device)
        on_gpu = self.ctx.device.type == "cuda"
        self.synced = False  # no all-reduce yet: the reducer still has its initial layout
        return DistributedDataParallel(
            model,
            device_ids=[self.ctx.local_rank] if on_gpu else None,
            find_unused_parameters=self.cfg.engine.find_unused_parameters,
            bucket_cap_mb=self.cfg.engine.bucket_cap_mb,
        )

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager:
        self.synced = self.synced or sync
        return contextlib.nullcontext() if sync else self.wrapped.no_sync()

    def make_scaler(self):
        return torch.amp.GradScaler(self.ctx.device.type)

    def load(self, path: Path, saved_world_size: int) -> dict[str, Any]:
        client = super().load(path, saved_world_size)
        self.prime_buckets()
        return client

    def prime_buckets(self) -> None:
        """Give a DDP that has not reduced yet the bucket layout it has after one step, so that a
        resume is bitwise at any world size (why: docs/design/train.md, DDP's bucket layout)."""
        if self.synced or self.cfg.engine.find_unused_parameters:
            return  # already rebuilt, or never rebuilt (unused-parameter search)
        device = self.ctx.device
        devices = [device.index or 0] if device.type == "cuda" else []  # [] : the CPU's only
        ids = torch.zeros((1, self.cfg.data.seq_len), dtype=torch.long, device=device)
        with torch.random.fork_rng(devices=devices):
            with self._autocast():
                loss = causal_lm_loss(self.wrapped, ids)
            loss.backward()  # records the ready order; the rebuild comes next forward
        self.optimizer.zero_grad(set_to_none=True)
        self.synced = True
