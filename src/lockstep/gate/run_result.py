"""One training run as the gates see it: per-step rows (the last row for a step counts) plus
what was measured from outside, and the run-level figures (`summary`)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from lockstep import track
from lockstep.errors import UsageError
from lockstep.track import as_float

# Per-step fields that are not training curves: timing and memory are gated as run-level
# figures (`summary`), the rest are bookkeeping.
PERF_STEP_FIELDS = ("step_time_s", "tokens_per_s", "mem_bytes", "mem_frac", "sync_time_s")
NOT_METRICS = ("step", "time", "tokens", "skipped", "mem_kind", "rank", "param_digest")


@dataclass
class Run:
    rows: list[dict]
    wall_s: float | None = None
    peak_rss_bytes: dict[str, int] = field(default_factory=dict)  # process label -> bytes
    gpu_mem_bytes: dict[str, int] = field(default_factory=dict)
    log: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. a tolerated abort at exit

    @property
    def steps(self) -> list[int]:
        return [row["step"] for row in self.rows]

    def series(self, metric: str) -> list[float]:
        """The metric's value at every step (NaN where a row lacks it)."""
        return [as_float(row.get(metric)) for row in self.rows]

    def metrics(self) -> list[str]:
        """Numeric per-step fields present in the rows, curves first."""
        names: dict[str, None] = {}
        for row in self.rows:
            for name, value in row.items():
                if name in NOT_METRICS or isinstance(value, bool):
                    continue
                if isinstance(value, int | float) or value in ("nan", "inf", "-inf"):
                    names[name] = None
        return sorted(names, key=lambda n: (n in PERF_STEP_FIELDS, n))


def rows_from_records(records: list[dict], source: str) -> list[dict]:
    by_step: dict[int, dict] = {}
    for record in records:
        if not isinstance(record, dict) or "step" not in record or "event" in record:
            continue
        try:
            step = int(record["step"])
        except (TypeError, ValueError):
            raise UsageError(f"{source}: step {record['step']!r} is not an integer") from None
        by_step[step] = {**record, "step": step}
    rows = [by_step[s] for s in sorted(by_step)]
    _derive_step_times(rows)
    return rows


def _derive_step_times(rows: list[dict]) -> None:
    """A script that logs only `time` (unix seconds at the end of the step) still gets
    step times: the difference to the previous step's `time`."""
    if not rows or any("step_time_s" in row for row in rows):
        return
    for prev, row in itertools.pairwise(rows):
        if row["step"] == prev["step"] + 1 and "time" in row and "time" in prev:
            row["step_time_s"] = as_float(row["time"]) - as_float(prev["time"])


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a metrics JSONL; a missing file or a corrupt line is bad input, named."""
    rows = rows_from_records(track.read(path), str(path))
    if not rows:
        raise UsageError(f"{path} holds no step rows; each line needs at least a 'step'")
    return rows


def warmup_steps(n: int) -> int:
    """Steps left out of timing: the first 20%, at least 1 while 2 or more remain."""
    return min(max(1, math.ceil(0.2 * n)), max(0, n - 2)) if n > 1 else 0


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if math.isfinite(v))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summary(run: Run) -> dict[str, float]:
    """Run-level figures: steady-state medians of time and throughput, peak and growth of
    memory, and what was measured from outside. Absent figures are left out."""
    out: dict[str, float] = {}
    steady = run.rows[warmup_steps(len(run.rows)) :]
    for name in ("step_time_s", "tokens_per_s"):
        value = _median([as_float(r.get(name)) for r in steady])
        if value is not None:
            out[name] = value
    mem = [as_float(r.get("mem_bytes")) for r in run.rows]
    if any(math.isfinite(m) for m in mem):
        out["mem_bytes"] = max(m for m in mem if math.isfinite(m))
        steady_mem = [as_float(r.get("mem_bytes")) for r in steady]
        steady_mem = [m for m in steady_mem if math.isfinite(m)]
        if len(steady_mem) >= 2:
            out["mem_growth_bytes"] = steady_mem[-1] - steady_mem[0]
    if run.peak_rss_bytes:
        out["peak_rss_bytes"] = max(run.peak_rss_bytes.values())
    if run.gpu_mem_bytes:
        out["gpu_mem_bytes"] = max(run.gpu_mem_bytes.values())
    if run.wall_s is not None:
        out["wall_s"] = run.wall_s
    return out
