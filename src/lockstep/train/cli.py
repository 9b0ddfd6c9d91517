"""`lockstep train` and `lockstep ds-config`: their parsers; the work is in `train.start` and
`train.deepspeed_config`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep import job_options
from lockstep.inputs import positive_int


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train",
        help="run the reference training job (ddp, fsdp, zero1/2/3)",
        description="Train under torchrun, the deepspeed launcher or srun, or start --nproc "
        "local ranks. Writes DIR/metrics.jsonl, DIR/checkpoints/ and wandb files under DIR, "
        "and the flight recorders' dumps of local ranks past --timeout in DIR/flight-recorder/.",
    )
    job_options.config(train, required=True)
    job_options.nproc(train, note=" without a launcher")
    train.add_argument("--out", default="runs/train", help="output directory (default runs/train)")
    job_options.overrides(train)
    job_options.timeout(train, note=" of --nproc local ranks")
    train.set_defaults(func=run_train)

    ds = subparsers.add_parser(
        "ds-config",
        help="check a DeepSpeed config before launch",
        description="One line per problem; exit 1 if there is any.",
    )
    ds.add_argument("file", help="ds_config.json")
    ds.add_argument(
        "--world-size", type=positive_int, required=True, help="ranks the job will run on"
    )
    ds.set_defaults(func=run_ds_config)


def run_train(args: argparse.Namespace) -> int:
    from lockstep.train import start

    options = start.TrainOptions(
        config=args.config,
        overrides=tuple(args.overrides),
        nproc=args.nproc,
        out=Path(args.out),
        timeout=args.timeout,
    )
    return start.train(options)


def run_ds_config(args: argparse.Namespace) -> int:
    from lockstep.train.deepspeed_config import check_file

    return check_file(args.file, args.world_size)
