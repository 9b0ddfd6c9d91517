"""Compare a run with a golden, vectorized over steps: per-step bands, windowed means,
run-level performance. A failure keeps the run's values at every failing step."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from lockstep import run_health
from lockstep.gate import policy
from lockstep.gate.golden import Golden, window_bounds
from lockstep.gate.run_result import Run, summary


@dataclass
class Finding:
    """One gate on one metric: a row of the report, a JUnit test case."""

    gate: str  # "curve", "window" or "perf"
    metric: str
    status: str  # "pass", "fail", "skip" or "not_judged" (exit 4: it says why)
    message: str
    step: int | None = None
    value: float | None = None
    center: float | None = None
    band: float | None = None
    abs_err: float | None = None
    rel_err: float | None = None
    worse: bool | None = None  # the departure is in the metric's worse direction
    failing: list[dict] = field(default_factory=list)  # {step, value, center, abs_err, rel_err}

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict:
        return asdict(self)


def compare(golden: Golden, run: Run, same_machine: bool = True) -> list[Finding]:
    findings = []
    current = {step: i for i, step in enumerate(run.steps)}
    idx = np.array([current.get(int(s), -1) for s in golden.steps], dtype=np.int64)
    missing = golden.steps[idx < 0]
    for metric, tol in golden.header["curves"].items():
        if missing.size:
            findings.append(
                Finding(
                    "curve",
                    metric,
                    "fail",
                    f"the run logged no step {int(missing[0])} ({missing.size} of "
                    f"{golden.steps.size} golden steps missing): it stopped early or skipped steps",
                    step=int(missing[0]),
                )
            )
            continue
        rows = [run.rows[i] for i in idx]
        broken = run_health.first_non_finite(rows, (metric,))
        if broken is not None:
            findings.append(_non_finite(broken, rows))
            continue
        values = np.array(run.series(metric), dtype=float)[idx]
        findings.append(_curve(metric, tol, golden, values))
        if not tol["exact"]:
            findings.append(_windows(metric, tol, golden, values))
    idle = run_health.not_training(run.rows)
    if idle is not None:
        findings.append(Finding("curve", idle.metric, "fail", idle.text, step=idle.step))
    findings.extend(_perf(golden, summary(run), same_machine))
    return findings


def _non_finite(broken: run_health.Problem, rows: list[dict]) -> Finding:
    """A curve that holds NaN or inf: failed, never better or worse by a margin."""
    count = sum(run_health.is_non_finite(r.get(broken.metric)) for r in rows)
    return Finding(
        "curve",
        broken.metric,
        "fail",
        f"{broken.text} ({count} of {len(rows)} steps not finite)",
        step=broken.step,
        worse=True,
    )


def _curve(metric: str, tol: dict, golden: Golden, values: np.ndarray) -> Finding:
    center = golden.centers[metric]
    band = np.maximum(tol["tol_rel"] * np.abs(center), tol["tol_abs"])
    with np.errstate(invalid="ignore"):
        err = values - center
        # compared where the golden logged it; where the run did not, that fails
        bad = np.isfinite(center) & ~(np.abs(err) <= band)
    count = int(bad.sum())
    kind = "exact" if tol["exact"] else f"band ±{_pct(tol['tol_rel'])}"
    if count <= tol["budget"]:
        note = f", {count} outside (budget {tol['budget']})" if count else ""
        return Finding("curve", metric, "pass", f"{golden.steps.size} steps within {kind}{note}")
    failing = np.flatnonzero(bad)
    first = int(failing[0])
    finding = _at("curve", metric, golden, values, band, first, tol["direction"])
    finding.failing = [_point(golden, metric, values, int(i)) for i in failing]
    if not np.isfinite(values[first]):
        finding.worse = None
        finding.message = (
            f"{count} of {golden.steps.size} steps outside {kind} (budget {tol['budget']}); "
            f"first at step {finding.step}: {metric} not logged, golden {_num(finding.center)}"
        )
        return finding
    finding.message = (
        f"{count} of {golden.steps.size} steps outside {kind} (budget {tol['budget']}); first "
        f"at step {finding.step}: {metric}={_num(finding.value)}, golden "
        f"{_num(finding.center)} ± {_num(finding.band)} (abs err {_num(finding.abs_err)}, "
        f"rel err {_pct(finding.rel_err)}){_better_or_worse(finding)}"
    )
    return finding


def _windows(metric: str, tol: dict, golden: Golden, values: np.ndarray) -> Finding:
    center = golden.centers[metric]
    for a, b in window_bounds(center.size, tol["window"]):
        both = np.isfinite(center[a:b]) & np.isfinite(values[a:b])  # logged by both
        if not both.any():
            continue
        got, want = float(np.mean(values[a:b][both])), float(np.mean(center[a:b][both]))
        band = max(tol["window_tol_rel"] * abs(want), tol["tol_abs"])
        if not abs(got - want) <= band:
            rel = abs(got - want) / abs(want) if want else math.inf
            worse = _is_worse(tol["direction"], got - want)
            label = "final" if b == center.size else "windowed"
            return Finding(
                "window",
                metric,
                "fail",
                f"{label} mean over steps {int(golden.steps[a])}..{int(golden.steps[b - 1])}: "
                f"{_num(got)}, golden {_num(want)} ± {_num(band)} (rel err {_pct(rel)})"
                + (_direction_note(worse)),
                step=int(golden.steps[a]),
                value=got,
                center=want,
                band=band,
                abs_err=abs(got - want),
                rel_err=rel,
                worse=worse,
            )
    return Finding(
        "window",
        metric,
        "pass",
        f"means over windows of {tol['window']} steps within ±{_pct(tol['window_tol_rel'])}",
    )


def _perf(golden: Golden, figures: dict, same_machine: bool) -> list[Finding]:
    out = []
    for name, rec in golden.header["perf"].items():
        if not rec.get("gated", True):
            continue
        if name not in figures:
            out.append(Finding("perf", name, "skip", "not measured in this run"))
            continue
        if not same_machine:
            out.append(
                Finding(
                    "perf",
                    name,
                    "skip",
                    f"golden recorded on {golden.header.get('machine')}: a stored speed or "
                    "memory figure only holds on the same machine; use `lockstep gate ab`",
                )
            )
            continue
        finding = _perf_one(name, rec, float(figures[name]))
        out.append(finding if finding.failed else _too_wide(finding, rec) or finding)
    return out


def _too_wide(finding: Finding, rec: dict) -> Finding | None:
    """A relative threshold wider than `policy.PERF_JUDGED_REL` cannot catch the slowdowns a
    gate is for: the figure is not judged (a failure past it still fails)."""
    limit = rec.get("threshold_rel")
    if limit is None or limit <= policy.PERF_JUDGED_REL:
        return None
    repeats = len(rec.get("values") or ())
    finding.status = "not_judged"
    finding.message = (
        f"not judged: its threshold {_pct(limit)} (from a spread of "
        f"{_pct(rec.get('spread_rel'))} over {repeats} repeats) is wider than "
        f"{_pct(policy.PERF_JUDGED_REL)}, so a smaller regression would pass; record the "
        "golden again with more repeats on a quieter machine (lockstep gate refresh "
        f"--repeats 10); this run: {finding.message}"
    )
    return finding


def _perf_one(name: str, rec: dict, value: float) -> Finding:
    center = rec["center"]
    diff = value - center
    if rec.get("threshold_abs") is not None:
        limit = rec["threshold_abs"]
        worse = _is_worse(rec["direction"], diff)
        over = abs(diff) > limit * (1 if worse else policy.TOO_GOOD_FACTOR)
        shown = f"{_num(value)} vs golden {_num(center)} (limit ±{_num(limit)})"
    else:
        limit = rec["threshold_rel"]
        rel = diff / center if center else math.inf
        worse = _is_worse(rec["direction"], diff)
        over = abs(rel) > limit * (1 if worse else policy.TOO_GOOD_FACTOR)
        shown = f"{_num(value)} vs golden {_num(center)} ({rel:+.1%}, threshold {_pct(limit)})"
    finding = Finding(
        "perf",
        name,
        "fail" if over else "pass",
        shown,
        value=value,
        center=center,
        band=limit,
        abs_err=abs(diff),
        rel_err=abs(diff) / abs(center) if center else None,
        worse=worse,
    )
    if over:
        finding.message = f"{'worse' if worse else 'far better'}: {shown}" + (
            "" if worse else "; the golden is stale: refresh it (lockstep gate refresh)"
        )
    return finding


def _at(gate, metric, golden, values, band, i, direction) -> Finding:
    p = _point(golden, metric, values, i)
    return Finding(
        gate,
        metric,
        "fail",
        "",
        step=p["step"],
        value=p["value"],
        center=p["center"],
        band=float(band[i]),
        abs_err=p["abs_err"],
        rel_err=p["rel_err"],
        worse=_is_worse(direction, p["value"] - p["center"]),
    )


def _point(golden: Golden, metric: str, values: np.ndarray, i: int) -> dict:
    value, center = float(values[i]), float(golden.centers[metric][i])
    err = abs(value - center)
    return {
        "step": int(golden.steps[i]),
        "value": value,
        "center": center,
        "abs_err": err,
        "rel_err": err / abs(center) if center else math.inf,
    }


def _is_worse(direction: str, diff: float) -> bool | None:
    if direction == "lower":
        return diff > 0
    if direction == "higher":
        return diff < 0
    return None


def _better_or_worse(f: Finding) -> str:
    return _direction_note(f.worse)


def _direction_note(worse: bool | None) -> str:
    if worse is None:
        return ""
    return " (worse)" if worse else " (better than the golden: if intended, refresh it)"


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return f"{x:.6g}"


def _pct(x) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.3%}" if x < 0.01 else f"{x:.1%}"
