"""The accumulation check: micro batch × accumulation steps trains like one large batch."""

from __future__ import annotations

from pathlib import Path

from lockstep.checks.agreement import agree
from lockstep.checks.divergence_replay import trainer_side
from lockstep.checks.harness import check_config, trajectory, without_checkpoints, world_size
from lockstep.checks.result import CheckResult
from lockstep.errors import UsageError
from lockstep.train.config import RunConfig


def check_accumulation(cfg: RunConfig, workdir: Path) -> CheckResult:
    """Against one large batch of the same global size."""
    micro, accum, _ = cfg.batch_shape(world_size())
    if accum == 1:
        if micro % 2:
            raise UsageError(
                f"accumulation check: batch.micro_size={micro} with no accumulation; use an "
                "even micro_size or set batch.grad_accum >= 2"
            )
        micro, accum = micro // 2, 2
    configs = {
        f"micro {micro} × accumulation {accum}": check_config(
            cfg, batch__micro_size=micro, batch__grad_accum=accum, batch__global_size=0
        ),
        f"one batch of {micro * accum}": check_config(
            cfg, batch__micro_size=micro * accum, batch__grad_accum=1, batch__global_size=0
        ),
    }
    outs = ("accumulation-micro", "accumulation-large")
    runs = {k: trajectory(c, workdir / o) for (k, c), o in zip(configs.items(), outs, strict=True)}
    return agree(
        "accumulation",
        runs,
        cfg,
        "accumulated gradients are not averaged like one batch (a loss not divided by the "
        "accumulation steps, or a reduction on every micro batch)",
        sides={k: trainer_side(without_checkpoints(c)) for k, c in configs.items()},
        workdir=workdir,
        passes=("backward", "update"),  # micro batches against one batch
    )
