"""The job options that `check`, `gate record|refresh|check|ab` and `train` share, each
declared once with its one default: `JobOptions`, and field constructors for a command that
takes only some. Design: docs/design/options.md."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar

from lockstep.errors import UsageError
from lockstep.flags import flag
from lockstep.inputs import positive_int, seconds

NPROC = 2  # ranks per run
TIMEOUT_S = 1800.0  # seconds per run
FIRST_STEP_TIMEOUT_S = 600.0  # seconds a script's run may take to log its first step
FIRST_STEP_ENV = "LOCKSTEP_FIRST_STEP_TIMEOUT"  # sets it where no --first-step-timeout does


def config(required: bool = False) -> Any:
    return flag(
        help="run config (TOML) of lockstep's reference job, e.g. smoke/cpu-ddp.toml",
        default=MISSING if required else None,
    )


def overrides() -> Any:
    return flag(
        "--set", default=(), metavar="KEY=VALUE",
        help="with CONFIG: override a config field, e.g. --set engine.name=zero3 (repeatable)",
    )  # fmt: skip


def nproc(note: str = "") -> Any:
    return flag(
        "--nproc", type=positive_int, default=NPROC, metavar="N",
        help=f"ranks per run, started on this machine{note}",
    )  # fmt: skip


def timeout(note: str = "") -> Any:
    return flag(
        "--timeout", type=seconds, default=TIMEOUT_S, metavar="S",
        help=f"seconds per run{note} ({{default}}); a run past it is killed and its ranks' "
        "flight recorders name the collective each is in",
    )  # fmt: skip


def first_step_timeout() -> Any:
    return flag(
        "--first-step-timeout", type=seconds, default=None, metavar="S",
        shown=f"${FIRST_STEP_ENV}, else {FIRST_STEP_TIMEOUT_S:.0f}",
        help="with --script: seconds a run may take to log its first step ({default}); a run "
        "that logs none by then is killed (exit 3) and the last lines of its log are quoted",
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


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """The job a command runs (a run CONFIG with its `--set` overrides, or a protocol script),
    on how many ranks, for how long; `script_steps`: a script's steps without --steps."""

    script_steps: ClassVar[int] = 0
    steps_note: ClassVar[str] = ""

    config: str | None = config()
    script: str | None = flag(
        "--script", metavar="CMD", default=None,
        help="instead of CONFIG: your training command, which speaks lockstep's protocol "
        "(lockstep.track; docs/scripts.md), e.g. 'train.py --lr 3e-4'",
    )  # fmt: skip
    overrides: tuple[str, ...] = overrides()
    nproc: int = nproc()
    steps: int | None = flag(
        "--steps", type=positive_int, default=None, metavar="N",
        shown="the config's own; {script_steps} with --script",
        help="optimizer steps per run{steps_note}",
    )  # fmt: skip
    timeout: float = timeout()
    run_path: bool = flag(
        "--run-path", default=False,
        help="with --script: as torchrun --run-path, run the script (or -m module) with runpy "
        "in ranks forked from a process that already imported torch (seconds faster per run "
        "on CPU); not for a script that sets variables before `import torch` for torch to "
        "read (docs/scripts.md)",
    )  # fmt: skip

    @property
    def job(self) -> JobOptions:
        """These options as the job alone (a command's class adds its own fields)."""
        names = [f.name for f in dataclasses.fields(JobOptions)]
        return JobOptions(**{name: getattr(self, name) for name in names})
