"""Runs that must agree (equivalence, world size, accumulation), and `combine`, one result for
several runs of a check.
"""

from __future__ import annotations

from pathlib import Path

from lockstep.checks import noise_floor as nf
from lockstep.checks.divergence_replay import investigated, rank0
from lockstep.checks.harness import first_param_difference, numeric_tolerance
from lockstep.checks.result import CheckResult, skipped_notes, tolerance, unsound
from lockstep.checks.trajectory import first_divergence
from lockstep.module_digest import PASSES
from lockstep.train.config import RunConfig


def agree(
    name: str,
    runs: dict[str, tuple[list[dict], dict]],
    cfg: RunConfig,
    diagnosis: str,
    sides: dict | None = None,
    workdir: Path | None = None,
    passes: tuple[str, ...] = PASSES,
) -> CheckResult:
    """Every run against the first: loss, grad norm and lr per step, then final parameters
    (atol 1% of lr). With `sides`, a failure is replayed (`divergence_replay`)."""
    rtol, atol = numeric_tolerance(cfg)
    logged = {label: run_rows for label, (run_rows, _) in runs.items()}
    bad = unsound(name, logged)
    if bad is not None:
        return bad
    (base, (base_rows, base_params)), *others = runs.items()
    for label, (other_rows, other_params) in others:
        div = first_divergence(
            base_rows, other_rows, metrics=("loss", "grad_norm", "lr"), rtol=rtol, atol=atol
        )
        if div is not None:
            failed = CheckResult(
                name,
                False,
                f"{base} and {label} diverge at {div.describe(base, label)}",
                divergence=div,
                diagnosis=first_cause(div, diagnosis),
            )
            if sides is None or workdir is None:
                return failed
            found = investigated(
                failed,
                {base: sides[base], label: sides[label]},
                workdir / f"{name}-replay",
                len(base_rows),
                rtol,
                atol,
                passes=passes,
                float64=True,
                rows32=(base_rows, other_rows),
            )
            replay = (found.forensics.get("verdict") or {}).get("kind")
            later = False  # the floor fails a later step the replay did not judge
            if div.metric in nf.METRICS and replay not in ("factor", "dependence"):
                later = floor_verdict(found, sides[base], (base_rows, other_rows), workdir / name,
                              rtol, atol, decides=replay != "noise", after=div.step)  # fmt: skip
            if (replay == "noise" and not later) or found.verdict == "pass":
                found.passed, found.judged = True, True
                how = "a float64 replay" if replay == "noise" else "the noise floor"
                found.summary = (
                    f"{base} and {label} differ at {div.describe(base, label)} "
                    f"{tolerance(rtol, atol)}, which {how} shows to be rounding noise"
                )
                found.diagnosis = None
                continue
            return found
        diff = first_param_difference(base_params, other_params, rtol, 1e-2 * cfg.optimizer.lr)
        if diff:
            return CheckResult(
                name,
                False,
                f"{base} and {label}: metrics agree but the final {diff}",
                diagnosis=diagnosis,
            )
    steps = len(base_rows)
    return CheckResult(
        name,
        True,
        f"{', '.join(runs)} agree over {steps} steps {tolerance(rtol, atol)}",
        notes=skipped_notes(logged),
    )


def first_cause(div, diagnosis: str) -> str:
    """`diagnosis`, unless the loss differs at step 1, before any update."""
    if div.step == 1 and div.metric == "loss":
        return (
            "at step 1, before any update, so the runs start apart: the initial weights (a "
            f"seed or an init that differs) or the data (a batch or split that differs); else {diagnosis}"
        )
    return diagnosis


def floor_verdict(found: CheckResult, side, rows: tuple[list[dict], list[dict]], out: Path,
                  rtol: float, atol: float, decides: bool, after: int) -> bool:  # fmt: skip
    """`found` judged against the first side's noise floor (deciding with `decides`); True
    when the floor fails a step after `after`."""
    try:
        with nf.reordered():
            _, perturbed = side(len(rows[0]), None, out / "reordered")
    except Exception as exc:  # an engine that cannot rerun: the replay's verdict stands
        found.notes.append(f"no noise floor: the reordered run could not run: {exc!r}")
        return False
    judged = rank0(nf.judge(*rows, nf.measure(rows[0], [perturbed]), rtol, atol))
    found.notes.append(f"noise floor: {judged.text}")
    found.forensics = (found.forensics or {}) | {"noise_floor": judged.to_dict()}
    found.forensics["lines"] = [*found.forensics.get("lines", []), f"noise floor: {judged.text}"]
    if not decides:
        if judged.kind == "beyond" and (judged.step or 0) > after:
            found.summary += f"; rounding at step {after}, but beyond it later: {judged.text}"
            return True
        return False
    if judged.kind == "noise":
        found.passed = True
    elif judged.kind == "zero":
        found.judged = False
        found.summary += f"; no float64 replay decides and {judged.text}"
    else:
        found.diagnosis = f"{judged.text}; {found.diagnosis}"
    return False


def combine(name: str, results: list[CheckResult]) -> CheckResult:
    """One result for several: the first failure, else the first not judged, else all passed."""
    for verdict in ("fail", "not_judged"):
        for result in results:
            if result.verdict == verdict:
                return result
    return CheckResult(name, True, "; ".join(r.summary for r in results))
