"""Per-step metric trajectories (`step` plus metrics, as a run logs them): read, compared,
and their first divergence named.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from lockstep import run_health, track
from lockstep.errors import UsageError

DEFAULT_METRICS = ("loss", "grad_norm", "lr")
# differ between runs by nature; the regression gates judge them with their own noise model
VOLATILE = frozenset({"time", "tokens_per_s", "step_time_s", "mem_bytes", "mem_kind"})


@dataclass(frozen=True)
class Divergence:
    """The first place two trajectories disagree."""

    step: int
    metric: str
    expected: float | str | None
    actual: float | str | None

    def describe(self, expected_name: str = "expected", actual_name: str = "actual") -> str:
        return (
            f"step {self.step}: {self.metric} {expected_name}={self.expected!r} "
            f"{actual_name}={self.actual!r}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def read_metrics(path: Path) -> list[dict]:
    """A script's metrics (`track.read`); every line must name its step."""
    records = track.read(path, missing="the script must write LOCKSTEP_METRICS on rank 0")
    for number, record in enumerate(records, 1):
        if "step" not in record:
            raise UsageError(
                f"{path}: record {number} has no 'step'; each line needs 'step' and 'loss'"
            )
    return records


def by_step(records: list[dict]) -> dict[int, dict]:
    """Index records by step; a resumed run that re-logs a step keeps the last record."""
    return {int(r["step"]): r for r in records}


def agrees(a, b, rtol: float = 0.0, atol: float = 0.0, skipped: bool = False) -> bool:
    """Numbers within the tolerance, other values equal; NaN and inf never, except on a step
    both optimizers `skipped`."""
    x, y = run_health.number(a), run_health.number(b)
    if x is None or y is None:
        return a == b
    if not (math.isfinite(x) and math.isfinite(y)):
        return skipped and not math.isfinite(x) and not math.isfinite(y)
    return abs(x - y) <= atol + rtol * abs(y)


def first_divergence(
    expected: list[dict],
    actual: list[dict],
    metrics: tuple[str, ...] = DEFAULT_METRICS,
    steps: range | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> Divergence | None:
    """The first (step, metric) where `actual` differs from `expected`, or None; a missing
    step is one too (metric `step`)."""
    metrics = tuple(m for m in metrics if m not in VOLATILE)
    want, got = by_step(expected), by_step(actual)
    wanted_steps = sorted(want) if steps is None else [s for s in steps]
    for step in wanted_steps:
        if step not in want or step not in got:
            return Divergence(
                step, "step", step if step in want else None, step if step in got else None
            )
        for metric in metrics:
            if metric not in want[step]:
                continue
            a, b = want[step][metric], got[step].get(metric)
            skipped = run_health.skipped(want[step]) and run_health.skipped(got[step])
            if not agrees(b, a, rtol, atol, skipped and metric == "grad_norm"):
                return Divergence(step, metric, a, b)
    return None
