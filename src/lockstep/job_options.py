"""The job options that `lockstep check`, `lockstep gate record|refresh|check|ab` and `lockstep
train` share, each declared once with its one default (pip's `cli/cmdoptions.py` is the model):
a command's `cli.py` adds an option with its function here (`nproc(parser)`, or `job(parser)`
for the whole set) and reads the parsed values into a frozen options object (`job_of`), which
is what the code below the CLI gets.

The defaults: 2 ranks (a bug that needs more than one rank, the usual kind in distributed
training, does not show on one) and 1800 s per run (a hung collective ends the command, with
the flight recorders' report, instead of waiting forever). A script's run that logs no step
within 600 s is ended sooner (`first_step_timeout`): the examples' first step came 0.1-6 s
into the launch on 2 CPU cores (torchrun, --run-path, the deepspeed CLI, the HF Trainer), a
cold DeepSpeed op build takes about 2 minutes (docs/benchmarks.md: 118 s), and 600 s also
leaves room for a large model's load and NCCL's start, at a third of the run's 1800 s.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from lockstep.errors import UsageError
from lockstep.inputs import positive_int, seconds

NPROC = 2  # ranks per run
TIMEOUT_S = 1800.0  # seconds per run
FIRST_STEP_TIMEOUT_S = 600.0  # seconds a script's run may take to log its first step
FIRST_STEP_ENV = "LOCKSTEP_FIRST_STEP_TIMEOUT"  # sets it where no --first-step-timeout does


@dataclass(frozen=True)
class JobOptions:
    """The job a command runs: lockstep's reference job (a run CONFIG and its `--set`
    overrides) or a script under lockstep's protocol, on how many ranks, for how long."""

    config: str | None = None
    script: str | None = None
    overrides: tuple[str, ...] = ()
    nproc: int = NPROC
    steps: int | None = None  # None: the config's own, or the command's default for a script
    timeout: float = TIMEOUT_S
    run_path: bool = False  # a script's ranks forked from a process that imported torch


def config(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument(
        "config",
        nargs=None if required else "?",
        help="run config (TOML) of lockstep's reference job, e.g. smoke/cpu-ddp.toml",
    )


def script(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--script",
        metavar="CMD",
        help="instead of CONFIG: your training command, which speaks lockstep's protocol "
        "(lockstep.track; docs/scripts.md), e.g. 'train.py --lr 3e-4'",
    )


def overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="with CONFIG: override a config field, e.g. --set engine.name=zero3 (repeatable)",
    )  # fmt: skip


def nproc(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument(
        "--nproc", type=positive_int, default=NPROC, metavar="N",
        help=f"ranks per run, started on this machine{note} (default {NPROC})",
    )  # fmt: skip


def steps(parser: argparse.ArgumentParser, script_steps: int, note: str = "") -> None:
    """`script_steps`: what a script runs without --steps (the command's own default)."""
    parser.add_argument(
        "--steps", type=positive_int, default=None, metavar="N",
        help=f"optimizer steps per run{note} (default: the config's own; {script_steps} with "
        "--script)",
    )  # fmt: skip


def timeout(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument(
        "--timeout", type=seconds, default=TIMEOUT_S, metavar="S",
        help=f"seconds per run{note} (default {TIMEOUT_S:.0f}); a run past it is killed and its "
        "ranks' flight recorders name the collective each is in",
    )  # fmt: skip


def first_step_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--first-step-timeout", type=seconds, default=None, metavar="S",
        help=f"with --script: seconds a run may take to log its first step (default "
        f"${FIRST_STEP_ENV}, else {FIRST_STEP_TIMEOUT_S:.0f}); a run that logs none by then is "
        "killed (exit 3) and the last lines of its log are quoted",
    )  # fmt: skip


def first_step_default() -> float:
    """The first-step deadline where no --first-step-timeout gives one: FIRST_STEP_ENV when
    set (a bad value is a one-line error), else FIRST_STEP_TIMEOUT_S."""
    text = os.environ.get(FIRST_STEP_ENV, "").strip()
    if not text:
        return FIRST_STEP_TIMEOUT_S
    try:
        return seconds(text)
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"{FIRST_STEP_ENV}={text!r}: {err}") from None
    except ValueError:
        raise UsageError(f"{FIRST_STEP_ENV}={text!r}: not a number of seconds") from None


def run_path(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-path",
        action="store_true",
        help="with --script: as torchrun --run-path, run the script (or -m module) with runpy "
        "in ranks forked from a process that already imported torch (seconds faster per run "
        "on CPU); not for a script that sets variables before `import torch` for torch to "
        "read (docs/scripts.md)",
    )


def job(parser: argparse.ArgumentParser, script_steps: int, steps_note: str = "") -> None:
    """The whole set, read back by `job_of`: CONFIG or --script, --set, --nproc, --steps,
    --timeout, --run-path."""
    config(parser)
    script(parser)
    overrides(parser)
    nproc(parser)
    steps(parser, script_steps, steps_note)
    timeout(parser)
    run_path(parser)


def job_of(args: argparse.Namespace) -> JobOptions:
    """The options `job` added, as parsed."""
    return JobOptions(
        config=args.config,
        script=args.script,
        overrides=tuple(args.overrides),
        nproc=args.nproc,
        steps=args.steps,
        timeout=args.timeout,
        run_path=args.run_path,
    )
