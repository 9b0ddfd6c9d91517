"""ddp: torch DistributedDataParallel; accumulation skips the all-reduce with `no_sync`."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lockstep.train.engines.native import NativeEngine


class DDPEngine(NativeEngine):
    name = "ddp"
    gradients_sharded = False

    def wrap(self, model: nn.Module) -> nn.Module:
        model.to(self.ctx.device)
        on_gpu = self.ctx.device.type == "cuda"
        return DistributedDataParallel(
            model,
            device_ids=[self.ctx.local_rank] if on_gpu else None,
            find_unused_parameters=self.cfg.engine.find_unused_parameters,
            bucket_cap_mb=self.cfg.engine.bucket_cap_mb,
        )

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if sync else self.wrapped.no_sync()

    def make_scaler(self):
        return torch.amp.GradScaler(self.ctx.device.type)
