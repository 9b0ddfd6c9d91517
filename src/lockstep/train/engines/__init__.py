"""Engines behind one interface (`Engine`): ddp, fsdp (FSDP2), zero1/zero2/zero3 (DeepSpeed)."""

from __future__ import annotations

import warnings

from lockstep.train.engines.base import Engine, StepOutcome

# FSDP2 and DeepSpeed call these collectives on every step; torch 2.13 deprecates the names and
# warns once per call site and rank, which buries a run's own output. Nothing a user can act on.
DEPRECATED_INTERNAL_CALLS = (
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
)


def engine_modules(name: str) -> list[str]:
    """The modules engine `name` imports (its framework included), for a launcher to import
    once ahead of its ranks."""
    if name in ("ddp", "fsdp"):
        return [f"lockstep.train.engines.{name}"]
    return ["lockstep.train.engines.zero", "deepspeed"]


def build_engine(name: str, model, cfg, ctx) -> Engine:
    """Wrap `model` for engine `name`; imports only that engine's framework."""
    warnings.filterwarnings("ignore", DEPRECATED_INTERNAL_CALLS, FutureWarning)
    if name == "ddp":
        from lockstep.train.engines.ddp import DDPEngine as cls
    elif name == "fsdp":
        from lockstep.train.engines.fsdp import FSDPEngine as cls
    else:
        from lockstep.train.engines.zero import ZeroEngine as cls
    return cls(model, cfg, ctx)


__all__ = ["Engine", "StepOutcome", "build_engine", "engine_modules"]
