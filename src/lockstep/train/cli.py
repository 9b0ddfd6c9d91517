"""`lockstep train` and `lockstep ds-config`: their parsers, declared by their options; the
work is in `train.start` and `train.deepspeed_config`."""

from __future__ import annotations

from dataclasses import dataclass

from lockstep import flags
from lockstep.inputs import positive_int
from lockstep.train.start import TrainOptions


@dataclass(frozen=True)
class DsConfigOptions:
    file: str = flags.flag(help="ds_config.json")
    world_size: int = flags.flag(
        "--world-size", type=positive_int, help="ranks the job will run on"
    )


def register(subparsers) -> None:
    flags.command(
        subparsers, "train", TrainOptions, run_train,
        help="run the reference training job (ddp, fsdp, zero1/2/3)",
        description="Train under torchrun, the deepspeed launcher or srun, or start --nproc "
        "local ranks. Writes DIR/metrics.jsonl, DIR/checkpoints/ and wandb files under DIR, "
        "and the flight recorders' dumps of local ranks past --timeout in DIR/flight-recorder/.",
    )  # fmt: skip
    flags.command(
        subparsers, "ds-config", DsConfigOptions, run_ds_config,
        help="check a DeepSpeed config before launch",
        description="One line per problem; exit 1 if there is any.",
    )  # fmt: skip


def run_train(options: TrainOptions) -> int:
    from lockstep.train import start

    return start.train(options)


def run_ds_config(options: DsConfigOptions) -> int:
    from lockstep.train.deepspeed_config import check_file

    return check_file(options.file, options.world_size)
