"""fsdp: FSDP2 `fully_shard` on each transformer block and then the root, with optional
mixed precision and CPU offload; accumulation defers the reduce-scatter to the last micro
batch through `set_requires_gradient_sync`."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from lockstep.train.engines.native import NativeEngine
from lockstep.train.model import block_modules


class FSDPEngine(NativeEngine):
    name = "fsdp"
    gradients_sharded = True

    def wrap(self, model: nn.Module) -> nn.Module:
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        options = {"mesh": mesh, "reshard_after_forward": self.cfg.engine.reshard_after_forward}
        if self.amp_dtype is not None:
            options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=self.amp_dtype, reduce_dtype=torch.float32
            )
            self.amp_dtype = None  # FSDP casts; no autocast on top
        if self.cfg.engine.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")
        for block in block_modules(model):
            fully_shard(block, **options)
        fully_shard(model, **options)
        return model

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager:
        self.wrapped.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def make_scaler(self):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.ctx.device.type)
