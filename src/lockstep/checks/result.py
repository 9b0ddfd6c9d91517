"""What a check found, the same for the reference job and a user's script."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockstep import run_health
from lockstep.checks.trajectory import DEFAULT_METRICS, Divergence


@dataclass
class CheckResult:
    """`passed` and `judged` decide the verdict (not judged is never a pass); the rest is shown."""

    name: str
    passed: bool
    summary: str
    divergence: Divergence | None = None
    diagnosis: str | None = None
    logs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rank: int | None = None  # replicas: the rank whose replica departed
    forensics: dict | None = None  # `divergence_replay.Findings`
    judged: bool = True  # False: `summary` says why not
    problem: run_health.Problem | None = None  # NaN, does not train

    @property
    def verdict(self) -> str:
        """`pass`, `fail` or `not_judged`."""
        if not self.passed and self.judged:
            return "fail"
        return "pass" if self.passed and self.judged else "not_judged"

    def to_dict(self) -> dict:
        return {
            "check": self.name,
            "verdict": self.verdict,
            "passed": self.passed and self.judged,
            "summary": self.summary,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "diagnosis": self.diagnosis,
            "rank": self.rank,
            "notes": self.notes,
            "forensics": self.forensics,
            "problem": self.problem.to_dict() if self.problem else None,
            "logs": self.logs,
        }


def unsound(
    name: str, runs: dict[str, list[dict]], metrics: tuple[str, ...] = DEFAULT_METRICS, **extra
) -> CheckResult | None:
    """The failed result when one of `runs` ({label: records}) is unfit (`run_health.problem`)."""
    for label, records in runs.items():
        found = run_health.problem(records, metrics)
        if found is not None:
            return CheckResult(name, False, f"run {label}: {found.text}", problem=found, **extra)
    return None


def skipped_notes(runs: dict[str, list[dict]]) -> list[str]:
    """`run_health.skipped_notes` of each run, labelled."""
    return [f"run {label}: {n}" for label, rows in runs.items()
            for n in run_health.skipped_notes(rows)]  # fmt: skip


def tolerance(rtol: float, atol: float) -> str:
    """How two runs were compared, for a summary line."""
    return "bitwise" if rtol == atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"


def exit_code(results: list[CheckResult]) -> int:
    """1 if any check failed, else 4 if any could not judge, else 0."""
    from lockstep.errors import EXIT_FAIL, EXIT_NOT_JUDGED, EXIT_OK

    verdicts = {r.verdict for r in results}
    if "fail" in verdicts:
        return EXIT_FAIL
    return EXIT_NOT_JUDGED if "not_judged" in verdicts or not results else EXIT_OK
