"""Runs that must agree: every run of a numeric check (equivalence, world size,
accumulation) against the first, step by step, then the final parameters; and `combine`,
one result for several runs of a check."""

from __future__ import annotations

from pathlib import Path

from lockstep.checks.divergence_replay import investigated
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
    """Every run against the first: loss, grad norm and lr per step, then final parameters.

    Parameters get an absolute tolerance of 1% of the learning rate: Adam divides by the
    root of the second moment, which turns rounding differences in near-zero gradients into
    visible fractions of a step.

    With `sides` (each run's `divergence_replay.Side`), a failure is replayed: the first
    module and pass where the runs part, and in float64 whether the difference is rounding
    noise (then the check passes, saying so) or a real dependence.
    """
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
                diagnosis=diagnosis,
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
            if found.forensics["verdict"] and found.forensics["verdict"]["kind"] == "noise":
                found.passed = True
                found.summary = (
                    f"{base} and {label} differ at {div.describe(base, label)} "
                    f"{tolerance(rtol, atol)}, which a float64 replay shows to be rounding noise"
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


def combine(name: str, results: list[CheckResult]) -> CheckResult:
    """One result for several runs of a check: the first failure, else the first that could
    not judge, else every summary."""
    for verdict in ("fail", "not_judged"):
        for result in results:
            if result.verdict == verdict:
                return result
    return CheckResult(name, True, "; ".join(r.summary for r in results))
