"""The equivalence check: every engine on the same config agrees (`agreement.agree`)."""

from __future__ import annotations

from pathlib import Path

from lockstep.checks.agreement import agree
from lockstep.checks.divergence_replay import trainer_side
from lockstep.checks.harness import check_config, trajectory, without_checkpoints
from lockstep.checks.result import CheckResult
from lockstep.train.config import RunConfig
from lockstep.train.engine_table import ENGINES, engine_options


def engine_config(cfg: RunConfig, engine: str) -> RunConfig:
    """cfg on another engine, dropping options only the original engine understands."""
    reset = {f"engine__{k}": type(cfg.engine).model_fields[k].default for k in engine_options()}
    return check_config(cfg, engine__name=engine, **reset)


def check_equivalence(
    cfg: RunConfig, workdir: Path, engines: tuple[str, ...] = tuple(ENGINES)
) -> CheckResult:
    """ddp, fsdp and ZeRO-1/2/3 on the same config agree."""
    configs = {e: engine_config(cfg, e) for e in engines}
    runs = {e: trajectory(c, workdir / f"equivalence-{e}") for e, c in configs.items()}
    return agree(
        "equivalence",
        runs,
        cfg,
        "an engine computes a different loss, gradient reduction, clipping or update",
        sides={e: trainer_side(without_checkpoints(c)) for e, c in configs.items()},
        workdir=workdir,
    )
