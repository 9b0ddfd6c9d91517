"""ddp: torch DistributedDataParallel; accumulation skips the all-reduce with `no_sync`.

A resumed job's first step reduces its gradients in the bucket layout of the uninterrupted
run's later steps (`prime_buckets`), so that a resume is bitwise at any world size.
"""

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
        """Give a DDP that has not reduced yet the bucket layout it has after one step.

        DDP (torch 2.x, `find_unused_parameters=False`) reduces its first step's gradients in
        one bucket in parameter order; that backward records the order in which gradients
        become ready, and the next forward rebuilds the buckets with the parameters in that
        order (and a 1 MiB first bucket under the default cap; `Reducer::rebuild_buckets`).
        Gloo's ring all-reduce adds the ranks' values for an element in an order set by its
        offset in the bucket, so past two ranks a step reduced in the first layout differs in
        the last bits from the same step in the rebuilt one (gpt2-tiny: one 449,536-byte bucket
        either way, parameters 0..27 first, 26 27 25 24 ... 1 0 after the rebuild). An uninterrupted run reduces only step 1 in the first layout; a
        resumed one would reduce its first step (3, say) there too. One forward and backward
        on a dummy batch (token 0, one sample; the ready order depends on the graph, not the
        values) records the order as step 1 would; the gradients are dropped and the RNG
        state restored, so the next step starts from exactly the checkpoint's state.
        """
        if self.synced or self.cfg.engine.find_unused_parameters:
            return  # already rebuilt (or about to be); never rebuilt with unused-parameter search
        device = self.ctx.device
        devices = [device.index or 0] if device.type == "cuda" else []  # [] : the CPU's only
        ids = torch.zeros((1, self.cfg.data.seq_len), dtype=torch.long, device=device)
        with torch.random.fork_rng(devices=devices):
            with self._autocast():
                loss = causal_lm_loss(self.wrapped, ids)
            loss.backward()  # all-reduced in the first layout; the rebuild comes next forward
        self.optimizer.zero_grad(set_to_none=True)
        self.synced = True
