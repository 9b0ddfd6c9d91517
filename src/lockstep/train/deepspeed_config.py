"""DeepSpeed configs: generated from the run config in the usual ZeRO shapes (`generate`), and
checked before any launch (`problems`). Design: docs/design/train.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lockstep.errors import UsageError
from lockstep.train.config import RunConfig
from lockstep.train.engine_table import ENGINES

FP16_DYNAMIC = {
    "enabled": True,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "initial_scale_power": 16,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
# Top-level sections DeepSpeed reads from modules other than deepspeed.runtime.constants.
_OTHER_SECTIONS = {
    "zero_optimization", "activation_checkpointing", "flops_profiler", "wandb", "tensorboard",
    "csv_monitor", "comet", "comms_logger", "aio", "nebula", "compression_training",
    "data_efficiency", "curriculum_learning", "elasticity", "autotuning", "sparse_attention",
    "pipeline", "amp", "hybrid_engine", "weight_quantization", "sequence_parallel_size",
    "mics_shard_size", "mics_hierarchical_params_gather", "compile", "timers", "eigenvalue",
    "quantize_training", "progressive_layer_drop", "tensor_parallel", "expert_parallel",
    "zero_quantized_weights", "graph_harvesting", "gradient_accumulation_dtype",
}  # fmt: skip


def _hidden_size(model) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def resolve_auto(ds: dict[str, Any], cfg: RunConfig, world_size: int, model=None) -> dict[str, Any]:
    """Replace "auto" as the transformers integration does: batch and clipping from the run
    config, bucket sizes and stage-3 thresholds from the model's hidden size."""
    micro, accum, global_size = cfg.batch_shape(world_size)
    top = {
        "train_batch_size": global_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": cfg.clip.max_norm,
    }
    out = json.loads(json.dumps(ds))
    for key, value in top.items():
        if out.get(key) == "auto":
            out[key] = value
    zero = out.get("zero_optimization", {})
    hidden = _hidden_size(model) if model is not None else None
    by_hidden = {
        "reduce_bucket_size": lambda h: h * h,
        "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
        "stage3_param_persistence_threshold": lambda h: 10 * h,
    }
    for key, rule in by_hidden.items():
        if zero.get(key) == "auto" and hidden:
            zero[key] = rule(hidden)
    return out


def generate(cfg: RunConfig, world_size: int, device: str, model=None) -> dict[str, Any]:
    """The DeepSpeed config for engine zero1/zero2/zero3 of this run."""
    stage = ENGINES[cfg.engine.name].zero_stage
    on_gpu = device == "cuda"
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": on_gpu, "contiguous_gradients": True}
    if stage < 3:
        # on CPU DeepSpeed allocates the bucket every micro step: sized to the model there
        bucket = 2e8 if on_gpu or model is None else min(2e8, _numel(model))
        zero |= {
            "allgather_partitions": True,
            "allgather_bucket_size": bucket,
            "reduce_scatter": True,
            "reduce_bucket_size": bucket,
        }
    else:
        zero |= {
            "sub_group_size": 1e9,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    if cfg.engine.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if cfg.engine.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    o = cfg.optimizer
    adam = {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    if not on_gpu:
        # torch's AdamW: FusedAdam needs CUDA, CPUAdam a C++ build; and it equals ddp's, fsdp's
        adam["torch_adam"] = True
    ds: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": adam},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if not on_gpu and cfg.engine.offload_optimizer:
        ds["zero_force_ds_cpu_optimizer"] = False
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        ds["fp16"] = dict(FP16_DYNAMIC)
    return resolve_auto(ds, cfg, world_size, model)


def load_user_config(cfg: RunConfig, world_size: int, model=None) -> dict[str, Any]:
    """The user's ds_config.json with "auto" resolved; problems raise UsageError."""
    ds = read_json(cfg.engine.ds_config)
    ds = resolve_auto(ds, cfg, world_size, model)
    found = problems(ds, world_size)
    if found:
        raise UsageError(f"{cfg.engine.ds_config}: {found[0]} (run 'lockstep ds-config' for all)")
    return ds


def read_json(path: str | Path) -> dict[str, Any]:
    from lockstep.inputs import read_json

    data = read_json(path, "DeepSpeed config")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a DeepSpeed config must be a JSON object")
    return data


def _known_top_level() -> set[str]:
    import deepspeed.runtime.constants as constants

    names = {
        v
        for k, v in vars(constants).items()
        if k.isupper() and isinstance(v, str) and v.isidentifier()
    }
    return names | _OTHER_SECTIONS


def _known_fields(model_cls) -> set[str]:
    fields = model_cls.model_fields
    return set(fields) | {f.alias for f in fields.values() if f.alias}


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _auto_paths(v, f"{prefix}{k}.")]
    return [prefix[:-1]] if node == "auto" else []


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_SECTIONS = ("zero_optimization", "fp16", "bf16", "optimizer", "scheduler")


def _shape_problems(ds: dict[str, Any]) -> list[str]:
    """Values of the wrong type, which DeepSpeed itself would fail on much later (or loop on)."""
    found = []
    for key in _SECTIONS:
        if key in ds and not isinstance(ds[key], dict):
            found.append(f"{key} must be a JSON object, got {json.dumps(ds[key])[:40]}")
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict):
        for key in ("offload_optimizer", "offload_param"):
            if zero.get(key) is not None and not isinstance(zero[key], dict):
                found.append(f"zero_optimization.{key} must be a JSON object")
        if "stage" in zero and zero["stage"] not in (0, 1, 2, 3):
            found.append(f"zero_optimization.stage must be 0, 1, 2 or 3, got {zero['stage']!r}")
    for key in _BATCH_KEYS:
        value = ds.get(key)
        if value is None or value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            found.append(f'{key} must be a positive integer or "auto", got {json.dumps(value)}')
    return found


def problems(ds: dict[str, Any], world_size: int) -> list[str]:
    """Every problem in a DeepSpeed config, one line each; empty when it is fine."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    found = _shape_problems(ds)
    if found:
        return found  # the rules below read the values these name
    for key in sorted(set(ds) - _known_top_level()):
        found.append(f"unknown key '{key}': DeepSpeed has no such top-level setting")
    zero = ds.get("zero_optimization") or {}
    for key in sorted(set(zero) - _known_fields(DeepSpeedZeroConfig)):
        found.append(f"unknown key 'zero_optimization.{key}': DeepSpeed ZeRO has no such setting")
    for section, model_cls in (
        ("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig),
        ("offload_param", DeepSpeedZeroOffloadParamConfig),
    ):
        for key in sorted(set(zero.get(section) or {}) - _known_fields(model_cls)):
            found.append(f"unknown key 'zero_optimization.{section}.{key}'")
    stage = zero.get("stage", 0)
    offload_param = (zero.get("offload_param") or {}).get("device", "none")
    if offload_param not in (None, "none") and stage != 3:
        found.append(
            f"zero_optimization.offload_param is ignored at stage {stage}: "
            "parameter offload needs stage 3"
        )
    offload_opt = (zero.get("offload_optimizer") or {}).get("device", "none")
    if offload_opt not in (None, "none") and stage == 0:
        found.append(
            "zero_optimization.offload_optimizer is ignored at stage 0: use stage 1, 2 or 3"
        )
    if (ds.get("fp16") or {}).get("enabled") is True and (ds.get("bf16") or {}).get(
        "enabled"
    ) is True:
        found.append("fp16.enabled and bf16.enabled are both true: enable one of them")
    batch = [ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu")]
    accum = ds.get("gradient_accumulation_steps", 1)
    if (
        all(isinstance(v, int) for v in [*batch, accum])
        and batch[0] != batch[1] * accum * world_size
    ):
        found.append(
            f"train_batch_size={batch[0]} differs from train_micro_batch_size_per_gpu × "
            f"gradient_accumulation_steps × world size = {batch[1]}×{accum}×{world_size} = "
            f"{batch[1] * accum * world_size}"
        )
    for path in _auto_paths(ds):
        found.append(
            f"'{path}' is \"auto\": only an integration that fills it in (transformers' "
            "Trainer, lockstep train) accepts that; set a value"
        )
    return found


def check_file(path: str, world_size: int) -> int:
    """`lockstep ds-config FILE --world-size N`: one line per problem (exit 1), or one saying
    it is fine."""
    from lockstep import extras
    from lockstep.errors import EXIT_FAIL, EXIT_OK
    from lockstep.launch import rank_environment

    extras.require("lockstep ds-config", {"deepspeed": "its config classes"})

    # Only DeepSpeed's config classes are needed: skip its accelerator probe and its banner.
    rank_environment("cpu")

    found = problems(read_json(path), world_size)
    for line in found:
        print(f"{path}: {line}")
    if not found:
        print(f"{path}: ok for world size {world_size}")
    return EXIT_FAIL if found else EXIT_OK


# An entry of TORCH_CUDA_ARCH_LIST that DeepSpeed's op builder can read: `9.0`, `8.6+PTX`.
_DS_ARCH = re.compile(r"\d+\.\d+(\+PTX)?")


def arch_list_problem(value: str | None) -> str | None:
    """Why DeepSpeed cannot JIT-build its CUDA ops under this TORCH_CUDA_ARCH_LIST (an arch
    suffix such as `9.0a`), or None."""
    entries = [e for e in (value or "").replace(" ", ";").split(";") if e]
    odd = [e for e in entries if not _DS_ARCH.fullmatch(e)]
    if not odd:
        return None
    plain = ";".join(dict.fromkeys(re.sub(r"[a-z]+$", "", e) for e in entries))
    return (
        f"TORCH_CUDA_ARCH_LIST={value!r}: DeepSpeed cannot build its CUDA ops for {odd[0]!r} "
        f"(an arch suffix); run with TORCH_CUDA_ARCH_LIST={plain!r}"
    )
