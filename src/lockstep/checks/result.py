"""What a check found, the same for the reference job and a user's script."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockstep.checks.trajectory import Divergence


@dataclass
class CheckResult:
    """`passed` decides the exit code (0 or 1); the rest is what the report shows."""

    name: str
    passed: bool
    summary: str
    divergence: Divergence | None = None
    diagnosis: str | None = None
    logs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rank: int | None = None  # replicas: the rank whose replica departed
    # after a failure: where in the model the runs part (`divergence_replay.Findings`)
    forensics: dict | None = None

    def to_dict(self) -> dict:
        return {
            "check": self.name,
            "passed": self.passed,
            "summary": self.summary,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "diagnosis": self.diagnosis,
            "rank": self.rank,
            "notes": self.notes,
            "forensics": self.forensics,
            "logs": self.logs,
        }


def tolerance(rtol: float, atol: float) -> str:
    """How two runs were compared, for a summary line."""
    return "bitwise" if rtol == atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"
