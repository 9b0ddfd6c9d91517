"""The options of each `lockstep gate` subcommand, declared once: its flags (`gate/cli.py`
makes the parsers from them) and what `gate.commands` gets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from lockstep.flags import flag, nested
from lockstep.gate.policy import SCRIPT_STEPS
from lockstep.inputs import positive_int, writable
from lockstep.job_options import JobOptions

GOLDENS = "gates"  # the goldens' folder, DIR/NAME/ENV-KEY.json


@dataclass(frozen=True, kw_only=True)
class GateJob(JobOptions):
    script_steps: ClassVar[int] = SCRIPT_STEPS


@dataclass(frozen=True)
class Reports:
    """Where a result goes besides the terminal (and GitHub's step summary)."""

    json: Path | None = flag(
        "--json", type=Path, metavar="PATH", default=None, help="write the full result as JSON"
    )
    junit: Path | None = flag(
        "--junit", type=Path, metavar="PATH", default=None, help="write JUnit XML for CI"
    )
    plot: Path | None = flag(
        "--plot", type=Path, metavar="DIR", default=None, help="write a PNG per metric"
    )

    def __post_init__(self) -> None:
        """A path that cannot be written is refused before the runs, not after them."""
        writable(self.json, "--json", makes_folder=True)  # report.to_json makes it
        writable(self.junit, "--junit", makes_folder=True)


@dataclass(frozen=True, kw_only=True)
class Workdir:
    workdir: Path | None = flag(
        "--workdir", type=Path, default=None, shown="temp", help="keep each run's folder here"
    )


@dataclass(frozen=True, kw_only=True)
class GateRun(Workdir):
    """`gate record`, `refresh` or `check` (`command`) of the gate `name`, as parsed."""

    command: str
    name: str = flag(help="the gate's name: goldens live in DIR/NAME/")
    job: JobOptions = nested(GateJob)
    dir: Path = flag("--dir", type=Path, default=Path(GOLDENS), help="goldens' folder")
    repeats: int = flag(
        "--repeats", type=positive_int, default=3,
        help="runs to take the spread from, of a golden or a --candidate",
    )  # fmt: skip
    candidate: Path | None = flag(
        "--candidate", metavar="DIR", type=Path, default=None,
        help="where no golden exists for this environment, record one into DIR for a "
        "maintainer to review and commit (still exit 2)",
    )  # fmt: skip
    reports: Reports = nested(Reports)


@dataclass(frozen=True, kw_only=True)
class ABRun(Workdir):
    """`gate ab`, as parsed."""

    job: JobOptions = nested(GateJob)
    base: str = flag("--base", metavar="REF", help="git ref to compare with")
    rounds: int = flag("--rounds", type=positive_int, default=6, help="runs of each side")
    threshold: float = flag("--threshold", type=float, default=0.05, help="relative change")
    alpha: float = flag("--alpha", type=float, default=0.01, help="significance level")
    reports: Reports = nested(Reports, exclude=("plot",))


@dataclass(frozen=True)
class CompareRun:
    golden: Path = flag(type=Path, help="a golden file, e.g. gates/NAME/KEY.json")
    metrics: Path = flag(type=Path, help="metrics.jsonl of a finished run")
    reports: Reports = nested(Reports)


@dataclass(frozen=True)
class AlertsRun:
    rules: str = flag(help="a TOML rules file, or 'default' for lockstep's rules")
    metrics: Path = flag(type=Path, help="metrics.jsonl")
    json: Path | None = flag(
        "--json", type=Path, metavar="PATH", default=None, help="write the alerts as JSON"
    )
