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
    from lockstep.errors import EXIT_FAIL, UsageError
    from lockstep.train import launch
    from lockstep.train.config import load_config

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    world = launch.launcher_world_size()
    if world is None:
        if args.nproc < 1:
            raise UsageError(f"--nproc {args.nproc}: need at least 1")
        launch.preflight(cfg, args.nproc, out)
        print(f"lockstep: {launch.start_local_ranks(cfg, args.nproc, out)}")
        return 0
    from lockstep.train.trainer import run_training

    result = run_training(cfg, out)  # checks the config itself; rank 0 verifies the checkpoint
    if dist_rank() == 0:
        print(f"lockstep: {result.summary()}")
    return EXIT_FAIL if result.stopped_by else 0


def dist_rank() -> int:
    import os

    return int(os.environ.get("RANK", 0))


def run_ds_config(args: argparse.Namespace) -> int:
    import os

    from lockstep.errors import EXIT_FAIL, EXIT_OK
    from lockstep.train.deepspeed_config import problems, read_json

    # Only DeepSpeed's config classes are needed: skip its accelerator probe and its banner.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    found = problems(read_json(args.file), args.world_size)
    for line in found:
        print(f"{args.file}: {line}")
    if not found:
        print(f"{args.file}: ok for world size {args.world_size}")
    return EXIT_FAIL if found else EXIT_OK
