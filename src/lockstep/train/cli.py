"""`lockstep train` and `lockstep ds-config`."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train",
        help="run the reference training job (ddp, fsdp, zero1/2/3)",
        description="Train under torchrun, the deepspeed launcher or srun, or start --nproc "
        "local ranks. Writes DIR/metrics.jsonl, DIR/checkpoints/ and wandb files under DIR.",
    )
    train.add_argument("config", help="run config (TOML), e.g. smoke/cpu-ddp.toml")
    train.add_argument("--nproc", type=int, default=1, help="local ranks to start (default 1)")
    train.add_argument("--out", default="runs/train", help="output directory (default runs/train)")
    train.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field, e.g. --set engine.name=zero3 (repeatable)",
    )  # fmt: skip
    train.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help="with --nproc: kill the ranks after S seconds, their flight recorders dumped into "
        "OUT/flight-recorder/ and the collective each is in named (default: no limit)",
    )  # fmt: skip
    train.set_defaults(func=run_train)

    ds = subparsers.add_parser(
        "ds-config",
        help="check a DeepSpeed config before launch",
        description="One line per problem; exit 1 if there is any.",
    )
    ds.add_argument("file", help="ds_config.json")
    ds.add_argument("--world-size", type=int, required=True, help="ranks the job will run on")
    ds.set_defaults(func=run_ds_config)


def run_train(args: argparse.Namespace) -> int:
    """One rank of an outer launch (`lockstep.launch.detect` reads which), or, with none,
    `--nproc` local ranks started here after the config and resume checks."""
    from lockstep import extras
    from lockstep.errors import EXIT_FAIL, UsageError
    from lockstep.launch import detect
    from lockstep.train.config import load_config

    cfg = load_config(args.config, args.overrides)
    extras.require_config(f"lockstep train {args.config}", cfg)  # before any rank starts
    out = Path(args.out)
    info = detect.adopt()  # sets RANK, MASTER_ADDR, ... for srun, mpirun and PMI too
    if info is None:
        if args.nproc < 1:
            raise UsageError(f"--nproc {args.nproc}: need at least 1")
        _check_before_start(cfg, args.nproc, out)
        print(f"lockstep: {_start_local_ranks(cfg, args.nproc, out, args.timeout)}")
        return 0
    if args.timeout is not None:
        raise UsageError(f"--timeout is for --nproc local ranks; {info.launcher} started this one")
    _share_cores(cfg, info)
    from lockstep.train.trainer import run_training

    result = run_training(cfg, out)  # checks the config itself; rank 0 verifies the checkpoint
    if info.rank == 0:
        print(f"lockstep: {result.summary()}")
    return EXIT_FAIL if result.stopped_by else 0


def _share_cores(cfg, info) -> None:
    """Under srun or mpirun, which set no OMP_NUM_THREADS, give each rank the share of the
    node's cores that `--nproc` ranks get (torchrun sets OMP_NUM_THREADS itself). torch's
    default is every core per rank: on CPU the intra-op thread count changes the float sums,
    so `srun -N4 --ntasks-per-node 2` ended with another parameter digest than torchrun and
    `--nproc 8` on the same global batch (and oversubscribed the node)."""
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
    """Start `nproc` ranks on this machine, wait for them (at most `timeout` seconds); rank 0's
    summary, or the first failing rank's as a LockstepError. The ranks' flight-recorder dumps
    go to OUT/flight-recorder/ (`lockstep.forensics`)."""
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


def run_ds_config(args: argparse.Namespace) -> int:
    from lockstep import extras
    from lockstep.errors import EXIT_FAIL, EXIT_OK
    from lockstep.launch import rank_environment
    from lockstep.train.deepspeed_config import problems, read_json

    extras.require("lockstep ds-config", {"deepspeed": "its config classes"})

    # Only DeepSpeed's config classes are needed: skip its accelerator probe and its banner.
    rank_environment("cpu")

    found = problems(read_json(args.file), args.world_size)
    for line in found:
        print(f"{args.file}: {line}")
    if not found:
        print(f"{args.file}: ok for world size {args.world_size}")
    return EXIT_FAIL if found else EXIT_OK
