"""The engines, one module each behind the interface in `base` (`Engine`, `StepOutcome`).

Their table (each engine's name, class, options, checkpoint format, ZeRO stage and optional
modules) is `lockstep.train.engine_table`, which the run config reads without importing
torch; its names are re-exported here for code written against `lockstep.train.engines`.
"""

from __future__ import annotations

from lockstep.train.engine_table import (
    DEPRECATED_INTERNAL_CALLS,
    ENGINES,
    EngineSpec,
    build_engine,
    engine_modules,
    engine_options,
    engines_clipping_by,
    engines_with,
    norm_types,
    register,
    resumes,
    series,
    shared_checkpoints,
    zero_stages,
)
from lockstep.train.engines.base import Engine, StepOutcome

__all__ = [
    "DEPRECATED_INTERNAL_CALLS",
    "ENGINES",
    "Engine",
    "EngineSpec",
    "StepOutcome",
    "build_engine",
    "engine_modules",
    "engine_options",
    "engines_clipping_by",
    "engines_with",
    "norm_types",
    "register",
    "resumes",
    "series",
    "shared_checkpoints",
    "zero_stages",
]
