"""The engine table: one `EngineSpec` row per engine, the one place an engine's name is written,
from which the run config, checkpoints, DeepSpeed configs and launchers derive what they know.
It imports neither torch nor `lockstep.train`: a row names its class as 'module:Class'.
Design: docs/design/train.md.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from lockstep.registry import Ref, Registry

# FSDP2 and DeepSpeed call these every step; torch 2.13 deprecates the names and warns once per
# call site and rank, burying a run's own output with nothing a user can act on.
DEPRECATED_INTERNAL_CALLS = (
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
)


@dataclass(frozen=True)
class EngineSpec:
    """One engine: its name in `engine.name`, its class, and the rules derived from it."""

    name: str
    engine: str  # 'module:Class' of its `Engine` subclass, imported only when a rank builds it
    checkpoint: str  # its format: engines writing the same one resume each other's
    options: tuple[str, ...] = ()  # the `engine.*` options only some engines understand
    norm_types: tuple[float, ...] = (2.0, math.inf)  # the clip.norm_type values it clips by
    norm_note: str = ""  # why it clips by no other norm type (in the error that says so)
    zero_stage: int | None = None  # DeepSpeed's ZeRO stage (its generated ds_config)
    requires: tuple[str, ...] = ()  # optional modules it imports (`lockstep.extras.EXTRA_OF`)
    # what its framework imports only when building, for a launcher to import ahead of its ranks
    preload: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The module that defines its class."""
        return Ref(self.engine).path

    def engine_class(self) -> type:
        """Its `Engine` subclass (imports its module, and with it torch)."""
        return Ref(self.engine).resolve()


# What the three ZeRO rows share: one class (the stage comes from the row), DeepSpeed's clipping
_DEEPSPEED = dict(
    engine="lockstep.train.engines.zero:ZeroEngine",
    norm_types=(2.0,),
    norm_note="DeepSpeed clips by the L2 norm",
    requires=("deepspeed",),
    # deepspeed.initialize's ZeRO optimizer check imports its Muon optimizer (and torch._inductor)
    preload=("deepspeed.runtime.zero.muon.muon_optimizer",),
)

ENGINES: Registry[EngineSpec] = Registry(
    "engine",
    [
        EngineSpec(
            "ddp",
            "lockstep.train.engines.ddp:DDPEngine",
            checkpoint="dcp",
            options=("find_unused_parameters", "bucket_cap_mb"),
        ),
        EngineSpec(
            "fsdp",
            "lockstep.train.engines.fsdp:FSDPEngine",
            checkpoint="dcp",
            options=("reshard_after_forward", "cpu_offload"),
        ),
        EngineSpec(
            "zero1",
            checkpoint="deepspeed-zero1",
            options=("offload_optimizer", "ds_config"),
            zero_stage=1,
            **_DEEPSPEED,
        ),
        EngineSpec(
            "zero2",
            checkpoint="deepspeed-zero2",
            options=("offload_optimizer", "ds_config"),
            zero_stage=2,
            **_DEEPSPEED,
        ),
        EngineSpec(
            "zero3",
            checkpoint="deepspeed-zero3",
            options=("offload_optimizer", "offload_params", "ds_config"),
            zero_stage=3,
            **_DEEPSPEED,
        ),
    ],
)
register = ENGINES.register  # an engine defined elsewhere (a plugin's, a test's)


def series(items, word: str = "or") -> str:
    """'a', 'a or b', 'a, b or c': how the errors list engines and values."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + f" {word} " + items[-1] if len(items) > 1 else "".join(items)


def engine_options() -> tuple[str, ...]:
    """The `engine.*` options some engine claims (each applies to those engines only)."""
    return tuple(dict.fromkeys(o for spec in ENGINES.values() for o in spec.options))


def engines_with(option: str) -> tuple[str, ...]:
    """The engines that understand `engine.<option>`, in table order."""
    return tuple(name for name, spec in ENGINES.items() if option in spec.options)


def norm_types() -> tuple[float, ...]:
    """Every clip.norm_type some engine supports."""
    return tuple(dict.fromkeys(n for spec in ENGINES.values() for n in spec.norm_types))


def engines_clipping_by(norm_type: float) -> tuple[str, ...]:
    return tuple(name for name, spec in ENGINES.items() if norm_type in spec.norm_types)


def zero_stages() -> dict[str, int]:
    """{engine: ZeRO stage} of the DeepSpeed engines."""
    return {n: s.zero_stage for n, s in ENGINES.items() if s.zero_stage is not None}


def resumes(saved: str, engine: str) -> bool:
    """Engine `engine` can resume a checkpoint engine `saved` wrote (same format); a name not
    in the table resumes nothing."""
    if saved == engine:
        return True
    a, b = ENGINES.get(saved), ENGINES.get(engine)
    return a is not None and b is not None and a.checkpoint == b.checkpoint


def shared_checkpoints() -> list[tuple[str, ...]]:
    """The groups of engines (two or more) that load each other's checkpoints."""
    groups: dict[str, list[str]] = {}
    for name, spec in ENGINES.items():
        groups.setdefault(spec.checkpoint, []).append(name)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def engine_modules(name: str) -> list[str]:
    """The modules engine `name` imports, for a launcher to import once ahead of its ranks."""
    spec = ENGINES[name]
    return [spec.module, *spec.requires, *spec.preload]


def build_engine(name: str, model, cfg, ctx):
    """Wrap `model` for engine `name` (an `Engine`); imports only that engine's framework."""
    warnings.filterwarnings("ignore", DEPRECATED_INTERNAL_CALLS, FutureWarning)
    return ENGINES[name].engine_class()(model, cfg, ctx)
