"""The metrics side of the black-box protocol: what a user's training script calls.

`lockstep check ... --script CMD` launches CMD with these variables set:

- `LOCKSTEP_METRICS`: a JSONL path; rank 0 writes one object per optimizer step;
- `LOCKSTEP_MAX_STEPS`: stop after that optimizer step, leaving a checkpoint;
- `LOCKSTEP_CHECKPOINT_DIR`: where checkpoints go;
- `LOCKSTEP_RESUME`: `1` to resume from the latest checkpoint there, else `0`.

`log(step, loss=..., grad_norm=..., lr=...)` writes those lines (rank 0 only) and forwards
them to wandb when a run is active. Outside a check, with LOCKSTEP_METRICS unset, it only
forwards to wandb, so a script can call it unconditionally.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Protocol:
    """The protocol's variables as a script sees them."""

    metrics: Path | None
    max_steps: int | None
    checkpoint_dir: Path | None
    resume: bool


def protocol() -> Protocol:
    env = os.environ
    return Protocol(
        metrics=Path(env["LOCKSTEP_METRICS"]) if env.get("LOCKSTEP_METRICS") else None,
        max_steps=int(env["LOCKSTEP_MAX_STEPS"]) if env.get("LOCKSTEP_MAX_STEPS") else None,
        checkpoint_dir=(
            Path(env["LOCKSTEP_CHECKPOINT_DIR"]) if env.get("LOCKSTEP_CHECKPOINT_DIR") else None
        ),
        resume=env.get("LOCKSTEP_RESUME") == "1",
    )


def _rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _plain(value):
    """Tensors and numpy scalars become Python numbers; NaN and inf become strings (JSON)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def log(step: int, **metrics) -> None:
    """Record one optimizer step's metrics (rank 0 writes; other ranks return at once)."""
    if _rank() != 0:
        return
    record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
    path = os.environ.get("LOCKSTEP_METRICS")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.log(
            {k: v for k, v in record.items() if k != "step"}, step=record["step"], commit=True
        )
