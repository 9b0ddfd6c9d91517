"""Run `lockstep train` as one rank of an existing launch (torchrun, the deepspeed launcher,
srun) or start N local ranks through torch.distributed.launcher.api (torchrun's own code).

Everything that can be checked is checked in the parent, so a bad config exits 2 before any
rank starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.errors import EXIT_FAIL, LockstepError, UsageError
from lockstep.local_ranks import run_local
from lockstep.train.config import RunConfig, from_dict

SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def check_launch_vars() -> bool:
    """True when a launcher set torch.distributed's variables; UsageError when it set only some."""
    present = [v for v in LAUNCH_VARS if v in os.environ]
    if not present:
        return False
    missing = [v for v in LAUNCH_VARS if v not in os.environ]
    if missing:
        raise UsageError(
            f"launcher variables half set: {', '.join(present)} present but {', '.join(missing)} "
            "missing; launch with torchrun, or unset them and use 'lockstep train --nproc N'"
        )
    return True


def launcher_world_size() -> int | None:
    """The world size an outer launcher set up, or None when we must start the ranks."""
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:
        adopt_slurm()
    return int(os.environ["WORLD_SIZE"]) if check_launch_vars() else None


def adopt_slurm() -> None:
    """Under srun: map SLURM's variables onto torch.distributed's."""
    missing = [v for v in SLURM_VARS if v not in os.environ]
    if missing:
        raise UsageError(f"srun variables half set: {', '.join(missing)} missing")
    if "MASTER_ADDR" not in os.environ:
        addr = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
        if not addr:
            raise UsageError("under srun set MASTER_ADDR (the first node's address)")
        os.environ["MASTER_ADDR"] = addr
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", 0)) % 1000))
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]


def preflight(cfg: RunConfig, world_size: int, out_dir: Path) -> None:
    """Config and resume checks before any rank starts."""
    from lockstep.train import checkpoint

    cfg.check(world_size)
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else out_dir / "checkpoints"
    path = checkpoint.find(root, cfg.checkpoint.resume)
    if path is not None:
        manifest = checkpoint.verify(path)
        checkpoint.check_compatible(manifest, path, cfg.engine.name)


def rank_main(config: dict, out_dir: str) -> tuple[int, str]:
    """Entry point of each locally started rank: (exit code, one-line message)."""
    from lockstep.train.trainer import run_training

    try:
        result = run_training(from_dict(config), out_dir)
    except LockstepError as err:
        return err.exit_code, str(err)
    return (EXIT_FAIL if result.stopped_by else 0), result.summary()


def start_local_ranks(cfg: RunConfig, nproc: int, out_dir: Path) -> str:
    """Start `nproc` ranks on this machine, wait for them, return rank 0's summary."""
    if cfg.resolved_device() == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    results = run_local(rank_main, (cfg.model_dump(mode="json"), str(out_dir)), nproc, "train")
    code, message = results[0]
    for rank in sorted(results):
        if results[rank][0]:
            code, message = results[rank]
            break
    if code:
        raise LockstepError(message, code)
    return message
