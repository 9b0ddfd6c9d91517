"""The run config: one TOML file, validated by pydantic, overridable with `--set key=value`
and in code (`derive`). Every error names the bad key in one line, before any rank starts."""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from lockstep import extras
from lockstep.errors import UsageError
from lockstep.train import engine_table
from lockstep.train.engine_table import ENGINES


def _engine_name(value: Any) -> str:
    """A name in the engine table, else pydantic's error for a Literal of those names."""
    if isinstance(value, str) and value in ENGINES:
        return value
    expected = engine_table.series([repr(name) for name in ENGINES])
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    preset: Literal["gpt2-tiny", "llama-tiny", "gpt2-small-bench"] = "gpt2-tiny"
    factory: str = Field(
        "", description="'module:function' returning an nn.Module; wins over preset"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="transformers config fields"
    )


# A count past this is a typo: `batch.micro_size=1e23` is refused, not looped over.
MAX_BATCH = 2**20


class DataConfig(_Section):
    seq_len: int = Field(32, gt=1, le=MAX_BATCH)
    factory: str = Field("", description="'module:function(seq_len, vocab_size) -> Sequence'")


class EngineConfig(_Section):
    name: Annotated[str, PlainValidator(_engine_name)] = "ddp"  # a row of the engine table
    find_unused_parameters: bool = False
    bucket_cap_mb: float = Field(25.0, gt=0)
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    offload_optimizer: bool = False
    offload_params: bool = False
    ds_config: str = Field(
        "", description="a user ds_config.json used instead of the generated one"
    )


class OptimizerConfig(_Section):
    lr: float = Field(1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    warmup_steps: int = Field(2, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class BatchConfig(_Section):
    micro_size: int = Field(4, gt=0, le=MAX_BATCH, description="sequences per rank per micro step")
    grad_accum: int = Field(
        0, ge=0, le=MAX_BATCH, description="micro steps per optimizer step; 0: derive"
    )
    global_size: int = Field(
        0, ge=0, le=MAX_BATCH * 1024, description="sequences per optimizer step; 0: derive"
    )


class ClipConfig(_Section):
    max_norm: float = Field(1.0, ge=0, description="0 disables clipping (the norm is still logged)")
    norm_type: float = Field(2.0, description="2 or inf (inf: ddp and fsdp only)")


class CheckpointConfig(_Section):
    every: int = Field(0, ge=0, description="save every N steps; 0: only at the end")
    at_end: bool = True
    keep: int = Field(2, ge=1)
    resume: str = Field("auto", description="auto (latest if any) | never | a checkpoint path")
    dir: str = Field("", description="default: OUT/checkpoints")


class LoggingConfig(_Section):
    wandb: Literal["offline", "online", "disabled"] = "offline"
    project: str = "lockstep"
    run_name: str = ""
    progress: bool = True


class AlertsConfig(_Section):
    enabled: bool = True
    rules: str = Field("default", description="'default' (lockstep's rules) or a TOML rules file")
    rule: list[dict[str, Any]] = Field(
        default_factory=list, description="more rules inline ([[alerts.rule]]), same keys"
    )

    def load(self):
        """The rules this run evaluates (`lockstep.alerts`); UsageError when malformed."""
        from lockstep import alerts

        if not self.enabled:
            return []
        return alerts.load_rules(self.rules) + alerts.parse_rules(
            {"rule": self.rule}, "config [[alerts.rule]]"
        )


class RunConfig(_Section):
    seed: int = 1234
    steps: int = Field(8, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    deterministic: bool = True
    activation_checkpointing: bool = False
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    clip: ClipConfig = Field(default_factory=ClipConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def batch_shape(self, world_size: int) -> tuple[int, int, int]:
        """(micro_size, grad_accum, global_size) for this world size, or a UsageError."""
        b = self.batch
        per_micro = b.micro_size * world_size
        if b.global_size:
            if b.global_size % per_micro:
                raise UsageError(
                    f"batch.global_size={b.global_size} is not divisible by batch.micro_size × "
                    f"world size = {b.micro_size}×{world_size}; change one of them"
                )
            accum = b.global_size // per_micro
            if b.grad_accum and b.grad_accum != accum:
                raise UsageError(
                    f"batch.grad_accum={b.grad_accum} disagrees with batch.global_size="
                    f"{b.global_size} / ({b.micro_size}×{world_size}) = {accum}; set only one"
                )
            return b.micro_size, accum, b.global_size
        accum = b.grad_accum or 1
        return b.micro_size, accum, per_micro * accum

    def check(self, world_size: int) -> None:
        """Everything that can be checked before a rank starts; raises UsageError."""
        e = self.engine
        self.batch_shape(world_size)
        for key in sorted(e.model_fields_set & set(engine_table.engine_options())):
            allowed = engine_table.engines_with(key)
            if e.name not in allowed and getattr(e, key) != EngineConfig.model_fields[key].default:
                raise UsageError(
                    f"engine.{key} applies to engine {', '.join(allowed)}, not '{e.name}'; "
                    "remove it"
                )
        norm, spec = self.clip.norm_type, ENGINES[e.name]
        if norm not in engine_table.norm_types():
            supported = engine_table.series(f"{n:g}" for n in engine_table.norm_types())
            raise UsageError(f"clip.norm_type={norm} is not supported; use {supported}")
        if norm not in spec.norm_types:
            why = f" ({spec.norm_note})" if spec.norm_note else ""
            raise UsageError(
                f"clip.norm_type={norm:g} is not supported by engine '{e.name}'{why}; use "
                f"norm_type {engine_table.series(f'{n:g}' for n in spec.norm_types)}, or engine "
                f"{engine_table.series(engine_table.engines_clipping_by(norm))}"
            )
        device = self.resolved_device()
        if device == "cpu" and self.precision != "fp32":
            raise UsageError(f"precision='{self.precision}' needs a GPU; CPU runs use 'fp32'")
        if e.ds_config and not Path(e.ds_config).is_file():
            raise UsageError(f"engine.ds_config: no such file {e.ds_config}")
        self.alerts.load()
        for key, spec in (
            ("model.factory", self.model.factory),
            ("data.factory", self.data.factory),
        ):
            if spec:
                resolve_factory(spec, key)


def resolve_factory(spec: str, key: str):
    """Import 'module:function' and return the callable; a UsageError names the key."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{key}='{spec}' must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{key}='{spec}': cannot import {module_name} ({exc})") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise UsageError(f"{key}='{spec}': {module_name} has no callable '{attr}'")
    return func


def config_needs(cfg: RunConfig, wandb: bool = True) -> dict[str, str]:
    """The optional modules the ranks of `cfg` import, each with what needs it (`wandb`
    False: the caller turns wandb off)."""
    needs = {}
    if not cfg.model.factory:
        needs["transformers"] = f"model preset {cfg.model.preset}"
    for module in ENGINES[cfg.engine.name].requires:  # deepspeed for a ZeRO engine
        needs[module] = f"engine {cfg.engine.name}"
    if wandb and cfg.logging.wandb != "disabled":
        needs["wandb"] = f"logging.wandb = '{cfg.logging.wandb}'"
    return needs


def require_config(what: str, cfg: RunConfig, wandb: bool = True) -> None:
    """One line naming the extra to install when a module `cfg` needs is missing."""
    extras.require(what, config_needs(cfg, wandb))


def _parse_value(text: str, what: str) -> Any:
    """A TOML value (`3`, `1e-3`, `true`, `"x"`, `[1, 2]`), else the bare text as a string."""
    from lockstep.inputs import bounded_depth, too_deep

    try:
        return bounded_depth(tomllib.loads(f"v = {text}")["v"], what)
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:  # tomllib recurses into arrays and inline tables
        raise too_deep(what) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set section.key=value` items (TOML values) applied to a config's data, in order."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set '{item}' must look like section.key=value")
        set_values(data, {key.strip(): _parse_value(value.strip(), f"--set {key.strip()}")})
    return data


def set_values(data: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Set each dotted key (`engine.name`) of `values` in a config's data, in order: what
    `--set` and `derive` both do."""
    for key, value in values.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"--set {key}: '{part}' is a value, not a section")
            node = child
        node[leaf] = value
    return data


def derive(cfg: RunConfig, source: str = "derived config", /, **dotted: Any) -> RunConfig:
    """A validated copy of `cfg` with overrides set as `--set` sets them, values already parsed:
    `engine__name="fsdp"` or `**{"logging.wandb": "disabled"}`."""
    values = {key.replace("__", "."): value for key, value in dotted.items()}
    return from_dict(set_values(cfg.model_dump(mode="json"), values), source)


def _one_line(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":  # said this way, a key named like a secret stays legible
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"{key}: {e['msg']}")
    return f"{source}: " + "; ".join(parts)


def from_dict(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise UsageError(_one_line(err, source)) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read a TOML run config, apply `--set` overrides, validate."""
    from lockstep.inputs import bounded_depth, read_toml

    data = apply_overrides(read_toml(path, "config file"), list(overrides))
    # a dotted --set key nests without bound too (`a.b.c...`): the same depth bound
    return from_dict(bounded_depth(data, f"{path} with --set"), str(path))
