"""Golden files: what the unchanged code produced, with the noise its repeats showed, as
diff-friendly JSON validated on every read. Design: docs/design/gates.md."""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep import run_health
from lockstep.errors import UsageError
from lockstep.gate import policy
from lockstep.gate.run_result import PERF_STEP_FIELDS, Run, summary
from lockstep.redact import redact_mapping

FORMAT = "lockstep.gate.golden/1"
ADVICE = "; fix it or record it again with `lockstep gate refresh`"


@dataclass
class Golden:
    header: dict
    steps: np.ndarray  # int64, one per row
    centers: dict[str, np.ndarray]  # metric -> float64 per row (NaN: not logged there)
    spreads: dict[str, np.ndarray]
    path: Path | None = None

    @property
    def name(self) -> str:
        return self.header["name"]

    @property
    def env_key(self) -> str:
        return self.header["env_key"]


def build(runs: list[Run], header: dict) -> Golden:
    """A golden from R repeats of the same job; `header` holds name, env, provenance."""
    if not runs:
        raise UsageError("no runs to record a golden from")
    steps = runs[0].steps
    for i, run in enumerate(runs[1:], 2):
        if run.steps != steps:
            raise UsageError(
                f"repeat {i} logged steps {_span(run.steps)}, repeat 1 logged {_span(steps)}; "
                "the job must log the same steps every time"
            )
    if not steps:
        raise UsageError("the job logged no steps; nothing to record")
    metrics = runs[0].metrics()
    for i, run in enumerate(runs, 1):
        idle = run_health.not_training(run.rows)
        if idle is not None:
            raise UsageError(f"repeat {i}: {idle.text}; fix the job before recording it")
    centers, spreads, curves = {}, {}, {}
    for metric in metrics:
        values = np.array([run.series(metric) for run in runs], dtype=float)  # NaN: not logged
        if metric not in PERF_STEP_FIELDS:
            for i, run in enumerate(runs, 1):
                broken = run_health.first_non_finite(run.rows, (metric,))
                if broken is not None:
                    raise UsageError(
                        f"repeat {i}, step {broken.step}: {metric} is {broken.value}; a golden "
                        "must be finite: fix the job before recording it"
                    )
        center = _nanmedian(values)
        spread = np.zeros(len(steps))
        if len(runs) > 1:
            dev = np.abs(values - center)
            seen = np.isfinite(dev).any(axis=0)
            spread[seen] = np.nanmax(dev[:, seen], axis=0)
            spread[~seen] = np.nan
        centers[metric], spreads[metric] = center, spread
        if metric not in PERF_STEP_FIELDS:
            curves[metric] = _curve_tolerance(metric, values, center, len(runs))
    perf = _perf_figures([summary(run) for run in runs])
    header = {
        **header,
        "format": FORMAT,
        "repeats": len(runs),
        "steps": {"first": steps[0], "last": steps[-1], "count": len(steps)},
        "curves": curves,
        "perf": perf,
    }
    return Golden(header, np.array(steps, dtype=np.int64), centers, spreads)


def _nanmedian(values: np.ndarray) -> np.ndarray:
    out = np.full(values.shape[1], np.nan)
    finite_cols = np.isfinite(values).any(axis=0)
    if finite_cols.any():
        out[finite_cols] = np.nanmedian(values[:, finite_cols], axis=0)
    return out


def _curve_tolerance(metric: str, values: np.ndarray, center: np.ndarray, repeats: int) -> dict:
    pol = policy.curve_policy(metric)
    n = values.shape[1]
    # NaN marks a step a metric was not logged at (a sparse metric): left out of each figure
    same = (values == values[0]) | (np.isnan(values) & np.isnan(values[0]))
    exact = bool(repeats > 1 and same.all())
    scale = np.maximum(np.abs(center), 1e-12)
    max_rel = _nanmax(np.abs(values - center) / scale) if repeats > 1 else 0.0
    width = policy.window_size(n)
    w_means = _window_means(values, width)
    w_center = _nanmedian(w_means)
    w_rel = _nanmax(np.abs(w_means - w_center) / np.maximum(np.abs(w_center), 1e-12))
    return {
        "direction": pol.direction,
        "exact": exact,
        "tol_rel": 0.0 if exact else max(pol.floor_rel, policy.CURVE_FACTOR * max_rel),
        "tol_abs": 0.0 if exact else pol.floor_abs,
        "max_rel_deviation": max_rel,
        "budget": policy.failing_step_budget(n, exact),
        "window": width,
        "window_tol_rel": 0.0 if exact else max(pol.floor_rel, policy.CURVE_FACTOR * w_rel),
    }


def _window_means(values: np.ndarray, width: int) -> np.ndarray:
    """Means over consecutive windows of `width` steps (a last, shorter window joins the one
    before), per row of `values`."""
    bounds = window_bounds(values.shape[-1], width)
    with warnings.catch_warnings():  # a window where the metric was never logged: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.stack([np.nanmean(values[..., a:b], axis=-1) for a, b in bounds], axis=-1)


def _nanmax(values: np.ndarray) -> float:
    """The largest value that is not NaN; 0 when none is."""
    seen = values[~np.isnan(values)]
    return float(seen.max()) if seen.size else 0.0


def window_bounds(n: int, width: int) -> list[tuple[int, int]]:
    edges = list(range(0, n - n % width if n >= width else 0, width)) or [0]
    bounds = [(a, a + width) for a in edges]
    bounds[-1] = (bounds[-1][0], n)
    return bounds


def _perf_figures(summaries: list[dict]) -> dict:
    out = {}
    names = [n for n in policy.PERF if all(n in s for s in summaries)]
    has_time = any(n in names for n in policy.TIME_FIGURES)
    for name in names:
        pol = policy.PERF[name]
        values = [float(s[name]) for s in summaries]
        center = float(np.median(values))
        spread_abs = max(abs(v - center) for v in values)
        spread_rel = spread_abs / abs(center) if center else 0.0
        out[name] = {
            "direction": pol.direction,
            "center": center,
            "values": values,
            "spread_rel": spread_rel,
            "threshold_rel": max(pol.floor_rel, policy.PERF_FACTOR * spread_rel)
            if pol.floor_rel
            else None,
            "threshold_abs": max(pol.floor_abs, policy.PERF_FACTOR * spread_abs)
            if pol.floor_abs
            else None,
            "gated": not (name == "wall_s" and has_time),
        }
    return out


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)" if steps else "nothing"


# --------------------------------------------------------------------------- file format


def to_text(golden: Golden) -> str:
    """The header, pretty-printed, then `"rows"`: one JSON object per line per step. The job's
    description is scrubbed of secrets (`--set api_token=...`): goldens are committed."""
    header = {k: v for k, v in golden.header.items()}
    if isinstance(header.get("job"), dict):
        header["job"] = redact_mapping(header["job"])
    head = json.dumps(header, indent=1, sort_keys=True, allow_nan=False)
    lines = []
    metrics = list(golden.centers)
    for i, step in enumerate(golden.steps.tolist()):
        row: dict = {"step": step}
        spread: dict = {}
        for m in metrics:
            c = golden.centers[m][i]
            if math.isfinite(c):
                row[m] = float(c)
                spread[m] = float(golden.spreads[m][i])
        row["spread"] = spread
        lines.append(json.dumps(row, allow_nan=False))
    body = ",\n  ".join(lines)
    return head[:-2] + ',\n "rows": [\n  ' + body + "\n ]\n}\n"


def write(golden: Golden, path: Path) -> Path:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    text = to_text(golden)
    problem = validate(json.loads(text))
    if problem:
        raise UsageError(f"refusing to write golden {path}: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    golden.path = path
    return path


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not allowed in a golden")


def read(path: str | Path) -> Golden:
    """A golden file, validated: what a hand edit or a merge breaks is one UsageError naming
    the file and the field."""
    path = Path(path)
    data = load_data(path)
    rows = data.pop("rows")
    steps = np.array([row["step"] for row in rows], dtype=np.int64)
    metrics: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key not in ("step", "spread"):
                metrics[key] = None
    centers, spreads = {}, {}
    for m in metrics:
        centers[m] = np.array([row.get(m, math.nan) for row in rows], dtype=float)
        spreads[m] = np.array([row.get("spread", {}).get(m, math.nan) for row in rows], dtype=float)
    return Golden(data, steps, centers, spreads, path)


def load_data(path: Path) -> dict:
    """The parsed and validated JSON of a golden file (header and rows)."""
    from lockstep.inputs import bounded_depth, read_text, too_deep

    text = read_text(path, "golden")
    try:
        data = bounded_depth(json.loads(text, parse_constant=_refuse_constant), f"golden {path}")
    except RecursionError:
        raise too_deep(f"golden {path}") from None
    except ValueError as err:
        raise UsageError(
            f"{path} is not a valid golden ({err}); record it again with `lockstep gate refresh`"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "rows" not in data:
        raise UsageError(
            f"{path} is not a lockstep golden ({FORMAT}); record one with `lockstep gate record`"
        )
    problem = validate(data)
    if problem:
        raise UsageError(f"{path}: {problem}{ADVICE}")
    return data


# --------------------------------------------------------------------------- validation

DIRECTIONS = ("lower", "higher", "none")


def _is_number(value) -> bool:
    """A finite int or float; JSON's true/false are not numbers here."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _show(value) -> str:
    return json.dumps(value) if isinstance(value, str | bool | None) else repr(value)


def _field(owner: dict, where: str, key: str, kind: str, *, optional: bool = False) -> str | None:
    """None when owner[key] is of `kind` (number, count, positive, bool, text, mapping), else
    what is wrong with it."""
    if key not in owner:
        return None if optional else f"{where}{key} is missing"
    value = owner[key]
    if optional and value is None:
        return None
    ok = {
        "number": lambda v: _is_number(v) and v >= 0,
        "count": lambda v: _is_number(v) and isinstance(v, int) and v >= 0,
        "positive": lambda v: _is_number(v) and isinstance(v, int) and v >= 1,
        "bool": lambda v: isinstance(v, bool),
        "text": lambda v: isinstance(v, str) and v != "",
        "mapping": lambda v: isinstance(v, dict),
    }[kind](value)
    if ok:
        return None
    want = {
        "number": "a finite number >= 0",
        "count": "an integer >= 0",
        "positive": "an integer >= 1",
        "bool": "true or false",
        "text": "a non-empty string",
        "mapping": "an object",
    }[kind]
    return f"{where}{key} is {_show(value)}, not {want}"


def validate(data: dict) -> str | None:
    """What is wrong with a golden's parsed JSON, as 'field: problem', or None. A golden that
    gates nothing is refused too: it would pass any run."""
    for key, kind in (("name", "text"), ("env_key", "text"), ("curves", "mapping"),
                      ("perf", "mapping")):  # fmt: skip
        if problem := _field(data, "", key, kind):
            return problem
    for metric, tol in data["curves"].items():
        where = f"curves.{metric}."
        if not isinstance(tol, dict):
            return f"curves.{metric} is {_show(tol)}, not an object"
        if tol.get("direction") not in DIRECTIONS:
            return f"{where}direction is {_show(tol.get('direction'))}, not one of {DIRECTIONS}"
        for key, kind in (("exact", "bool"), ("tol_rel", "number"), ("tol_abs", "number"),
                          ("budget", "count"), ("window", "positive"),
                          ("window_tol_rel", "number")):  # fmt: skip
            if problem := _field(tol, where, key, kind):
                return problem
    gated = 0
    for name, rec in data["perf"].items():
        where = f"perf.{name}."
        if name not in policy.PERF:
            return f"perf.{name} is not a performance figure ({', '.join(policy.PERF)})"
        if not isinstance(rec, dict):
            return f"perf.{name} is {_show(rec)}, not an object"
        if rec.get("direction") not in DIRECTIONS:
            return f"{where}direction is {_show(rec.get('direction'))}, not one of {DIRECTIONS}"
        if not _is_number(rec.get("center")):
            return f"{where}center is {_show(rec.get('center'))}, not a number"
        for key, kind, optional in (("threshold_rel", "number", True),
                                    ("threshold_abs", "number", True),
                                    ("gated", "bool", True)):  # fmt: skip
            if problem := _field(rec, where, key, kind, optional=optional):
                return problem
        if rec.get("threshold_rel") is None and rec.get("threshold_abs") is None:
            return f"{where}threshold_rel and threshold_abs are both missing"
        gated += bool(rec.get("gated", True))
    if not data["curves"] and not gated:
        return "it gates nothing (no curve in 'curves', no gated figure in 'perf')"
    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        return f"rows is {_show(rows) if not isinstance(rows, list) else '[]'}, not a list of steps"
    previous = None
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            return f"{where} is {_show(row)}, not an object"
        step = row.get("step")
        if "step" not in row:
            return f'{where} has no "step"'
        if not (isinstance(step, int) and not isinstance(step, bool)):
            return f"{where}.step is {_show(step)}, not an integer"
        if previous is not None and step <= previous:
            return f"{where}.step is {step}, not after the previous row's step {previous}"
        previous = step
        spread = row.get("spread", {})
        if not isinstance(spread, dict):
            return f"{where} (step {step}).spread is {_show(spread)}, not an object"
        for key, value in row.items():
            if key == "step" or key == "spread":
                continue
            if not _is_number(value):
                return f"{where} (step {step}).{key} is {_show(value)}, not a number"
        for key, value in spread.items():
            if not (_is_number(value) and value >= 0):
                return f"{where} (step {step}).spread.{key} is {_show(value)}, not a number >= 0"
        for metric in data["curves"]:
            if metric not in row:
                return f"{where} (step {step}) has no {metric}, which 'curves' gates"
    return None


def golden_path(directory: Path, name: str, env_key: str) -> Path:
    return directory / name / f"{env_key}.json"


def recorded(directory: Path, name: str) -> dict[str, dict]:
    """{env key: key fields} of every golden recorded under this name."""
    out = {}
    folder = directory / name
    if not folder.is_dir():
        return out
    from lockstep.inputs import load_json, read_text

    for path in sorted(folder.glob("*.json")):
        try:  # a pipe, device or huge file among them is skipped like a broken one
            head = load_json(read_text(path, "golden"), f"golden {path}")
            out[path.stem] = head["env"]["key_fields"]
        except (UsageError, KeyError, TypeError):
            continue
    return out
