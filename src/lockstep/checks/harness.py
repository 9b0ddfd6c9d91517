"""What the checks on lockstep's own harness share: the configs they train, their tolerances,
one run's trajectory. The checks are collective: every rank returns the same result.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lockstep.checks.state import first_tensor_difference, rows
from lockstep.train.config import RunConfig, derive
from lockstep.train.trainer import TrainResult, run_training

QUIET = {"logging.wandb": "disabled", "logging.progress": False}


def check_config(cfg: RunConfig, **dotted: Any) -> RunConfig:
    """A copy of `cfg` for a check's training: quiet (`QUIET`), with `section__key=value`
    overrides (`train.config.derive`)."""
    return derive(cfg, "check config", **{**QUIET, **dotted})


def without_checkpoints(cfg: RunConfig) -> RunConfig:
    """`cfg` saving no checkpoint and resuming none."""
    return check_config(
        cfg, checkpoint__at_end=False, checkpoint__every=0, checkpoint__resume="never"
    )


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def exact_tolerance(cfg: RunConfig) -> tuple[float, float]:
    if cfg.resolved_device() == "cpu" or cfg.deterministic:
        return 0.0, 0.0
    return 1e-3, 1e-6


def numeric_tolerance(cfg: RunConfig) -> tuple[float, float]:
    return (1e-5, 1e-7) if cfg.precision == "fp32" else (2e-2, 1e-3)


def first_param_difference(want, got, rtol, atol) -> str | None:
    diff = first_tensor_difference(want, got, rtol, atol)
    return f"parameters differ: {diff}" if diff else None


# Inside `shared_runs()`: the finished runs of this launch, by their config (`trained`).
_shared: dict[str, TrainResult] | None = None


@contextlib.contextmanager
def shared_runs():
    """While inside, the checks of one launch share a run of the same config (`trained`)."""
    global _shared
    outer, _shared = _shared, {}
    try:
        yield
    finally:
        _shared = outer


def trained(cfg: RunConfig, out: Path) -> TrainResult:
    """One run of `cfg` without checkpoints, its final state captured (shared: `shared_runs`)."""
    cfg = without_checkpoints(cfg)
    key = f"{world_size()}:{cfg.model_dump_json()}"
    if _shared is not None and key in _shared:
        return _shared[key]
    result = run_training(cfg, out, capture_state=True)
    if _shared is not None:
        _shared[key] = result
    return result


def fresh_trajectory(cfg: RunConfig, out: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """`trajectory`, trained here even where this launch already made the same run."""
    result = run_training(without_checkpoints(cfg), out, capture_state=True)
    return rows(result.steps), result.params


def trajectory(cfg: RunConfig, out: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """`trained`'s per-step rows and final parameters."""
    result = trained(cfg, out)
    return rows(result.steps), result.params
