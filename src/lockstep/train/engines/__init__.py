"""Engines behind one interface (`Engine`): ddp, fsdp (FSDP2), zero1/zero2/zero3 (DeepSpeed)."""

from __future__ import annotations

from lockstep.train.engines.base import Engine, StepOutcome


def build_engine(name: str, model, cfg, ctx) -> Engine:
    """Wrap `model` for engine `name`; imports only that engine's framework."""
    if name == "ddp":
        from lockstep.train.engines.ddp import DDPEngine as cls
    elif name == "fsdp":
        from lockstep.train.engines.fsdp import FSDPEngine as cls
    else:
        from lockstep.train.engines.zero import ZeroEngine as cls
    return cls(model, cfg, ctx)


__all__ = ["Engine", "StepOutcome", "build_engine"]
