"""The engines, one module each behind the interface in `base` (`Engine`, `StepOutcome`), and
their table's names (`lockstep.train.engine_table`, read without torch) re-exported.
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
