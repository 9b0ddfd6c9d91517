"""`lockstep train` below its parser: one rank of an outer launch, or `--nproc` local ranks
started here. Design: docs/design/train.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lockstep import job_options
from lockstep.flags import flag


@dataclass(frozen=True)
class TrainOptions:
    """A `lockstep train` command line, as parsed."""

    config: str = job_options.config(required=True)
    nproc: int = job_options.nproc(" without a launcher")
    out: str = flag("--out", default="runs/train", help="output directory")
    overrides: tuple[str, ...] = job_options.overrides()
    timeout: float = job_options.timeout(" of --nproc local ranks")


def train(options: TrainOptions) -> int:
    """One rank of an outer launch, or `options.nproc` local ranks."""
    from lockstep.errors import EXIT_FAIL, UsageError
    from lockstep.launch import detect
    from lockstep.train.config import load_config, require_config

    cfg = load_config(options.config, list(options.overrides))
    require_config(f"lockstep train {options.config}", cfg)  # before any rank starts
    out = Path(options.out)
    info = detect.adopt()  # sets RANK, MASTER_ADDR, ... for srun, mpirun and PMI too
    if info is None:
        if options.nproc < 1:
            raise UsageError(f"--nproc {options.nproc}: need at least 1")
        _check_before_start(cfg, options.nproc, out)
        print(f"lockstep: {_start_local_ranks(cfg, options.nproc, out, options.timeout)}")
        return 0
    if options.timeout != job_options.TIMEOUT_S:  # the outer launcher's own limits apply
        raise UsageError(f"--timeout is for --nproc local ranks; {info.launcher} started this one")
    _share_cores(cfg, info)
    from lockstep.train.trainer import run_training

    result = run_training(cfg, out)  # checks the config itself; rank 0 verifies the checkpoint
    if info.rank == 0:
        print(f"lockstep: {result.summary()}")
    return EXIT_FAIL if result.stopped_by else 0


def _share_cores(cfg, info) -> None:
    """Under srun or mpirun, which set no OMP_NUM_THREADS, give each rank the share of the
    node's cores that `--nproc` ranks get: the thread count changes CPU float sums."""
    import os

    from lockstep.launch import rank_environment

    if "OMP_NUM_THREADS" in os.environ:
        return
    rank_environment(cfg.resolved_device(), info.local_world_size or 1)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _check_before_start(cfg, world_size: int, out_dir: Path) -> None:
    """Config and resume checks in the parent, so a bad config exits 2 before any rank starts."""
    from lockstep.train import checkpoint

    cfg.check(world_size)
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else out_dir / "checkpoints"
    path = checkpoint.find(root, cfg.checkpoint.resume)
    if path is not None:
        manifest = checkpoint.verify(path)
        checkpoint.check_compatible(manifest, path, cfg.engine.name)


def _start_local_ranks(cfg, nproc: int, out_dir: Path, timeout: float | None = None) -> str:
    """Start `nproc` ranks here and wait (at most `timeout` s): rank 0's summary, or the first
    failing rank's as a LockstepError."""
    from lockstep.launch import run_local
    from lockstep.train.trainer import rank_modules

    config = cfg.model_dump(mode="json")
    return run_local(rank_main, (config, str(out_dir)), nproc, "train", cfg.resolved_device(),
                     preload=[__name__, *rank_modules(cfg)], timeout=timeout,
                     forensics=out_dir / "flight-recorder")  # fmt: skip


def rank_main(config: dict, out_dir: str):
    """Entry point of each locally started rank: its summary, or a LockstepError to raise."""
    from lockstep.errors import EXIT_FAIL, LockstepError
    from lockstep.train.config import from_dict
    from lockstep.train.trainer import run_training

    try:
        result = run_training(from_dict(config), out_dir)
    except LockstepError as err:
        return LockstepError(str(err), err.exit_code)
    return LockstepError(result.summary(), EXIT_FAIL) if result.stopped_by else result.summary()
