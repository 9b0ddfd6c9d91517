"""Whether a run's own metrics let it pass at all: every compared value finite, and signs that
it trains. The rules and their reasons: docs/design/protocol.md#run-health.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from lockstep.track import EMPTY_DIGEST

FLAT_STEPS = 3  # logged steps of one loss: flat
# exploding: over this many times the first loss, or LOSS_FLOOR
EXPLODE_FACTOR = 1e3
LOSS_FLOOR = 1.0
NON_FINITE_TEXT = frozenset(
    s + t for s in ("", "+", "-") for t in ("nan", "inf", "infinity")
)  # compared lowercased
NON_FINITE = "non-finite"
FLAT_LOSS = "flat loss"
ZERO_GRADIENTS = "zero gradients"
EMPTY = "empty digest"
NO_UPDATE = "no update"
EXPLODING = "exploding loss"


@dataclass(frozen=True)
class Problem:
    """Why a run cannot pass, at which step and metric."""

    kind: str
    step: int | None
    metric: str
    value: str  # as logged (repr of a float)
    text: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "step": self.step, "metric": self.metric, "value": self.value}


def number(value) -> float | None:
    """A logged number (or NaN, inf) as a float, else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in NON_FINITE_TEXT:
        return float(value.strip())
    return None


def is_non_finite(value) -> bool:
    """NaN or inf, however written."""
    x = number(value)
    return x is not None and not math.isfinite(x)


def skipped(record: dict) -> bool:
    """The optimizer skipped this step's update (fp16 loss scaling)."""
    return record.get("skipped") is True


def _in_order(records: list[dict]) -> list[dict]:
    """The last record of each step (a resume repeats steps), by step."""
    by_step = {int(r["step"]): r for r in records if "step" in r}
    return [by_step[s] for s in sorted(by_step)]


def first_non_finite(records: list[dict], metrics: tuple[str, ...]) -> Problem | None:
    """The first of `metrics` not finite, but a skipped step's gradient norm."""
    for record in _in_order(records):
        for metric in metrics:
            value = record.get(metric)
            if not is_non_finite(value) or (metric == "grad_norm" and skipped(record)):
                continue
            shown = repr(number(value))
            return Problem(NON_FINITE, int(record["step"]), metric, shown,
                           f"{metric} is {shown} at step {record['step']} (not a finite "
                           "number): a run that logs NaN or inf fails")  # fmt: skip
    return None


def skipped_notes(records: list[dict]) -> list[str]:
    """Skipped steps with a non-finite gradient norm: noted, not failed."""
    steps = [int(r["step"]) for r in _in_order(records)
             if skipped(r) and is_non_finite(r.get("grad_norm"))]  # fmt: skip
    if not steps:
        return []
    shown = ", ".join(map(str, steps[:10])) + (
        f" and {len(steps) - 10} more" if len(steps) > 10 else ""
    )
    return [f"step{'s' if len(steps) > 1 else ''} {shown}: grad_norm not finite on a step the "
            "optimizer skipped (fp16 loss scaling): not a failure"]  # fmt: skip


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def flat_loss(records: list[dict]) -> Problem | None:
    """`FLAT_STEPS` or more logged steps of one finite loss, bitwise."""
    logged = [(int(r["step"]), number(r.get("loss"))) for r in _in_order(records)]
    logged = [(s, x) for s, x in logged if x is not None and math.isfinite(x)]
    start = 0
    for i in range(1, len(logged) + 1):
        if i < len(logged) and _bits(logged[i][1]) == _bits(logged[start][1]):
            continue
        if i - start >= FLAT_STEPS:
            (first, x), (last, _) = logged[start], logged[i - 1]
            return Problem(FLAT_LOSS, first, "loss", repr(x),
                           f"loss is {x!r} at each of steps {first}..{last} ({i - start} logged "
                           "steps, bitwise identical): the run does not train (a loss that does "
                           "not depend on the parameters, frozen parameters, or no update)")  # fmt: skip
        start = i
    return None


def zero_gradients(records: list[dict]) -> Problem | None:
    """Gradient norms logged, all zero."""
    norms = [(int(r["step"]), number(r.get("grad_norm"))) for r in _in_order(records)]
    norms = [(s, x) for s, x in norms if x is not None]
    if not norms or any(x != 0 for _, x in norms):
        return None
    return Problem(ZERO_GRADIENTS, norms[0][0], "grad_norm", "0.0",
                   f"grad_norm is 0 at every one of the {len(norms)} logged steps: no gradient "
                   "reaches the parameters, so the run does not train (a loss detached from "
                   "the model, frozen parameters, or gradients zeroed before the norm)")  # fmt: skip


def empty_digest(records: list[dict]) -> Problem | None:
    """A parameter digest of no tensor."""
    for record in _in_order(records):
        if record.get("param_digest") == EMPTY_DIGEST:
            return Problem(EMPTY, int(record["step"]), "param_digest", EMPTY_DIGEST,
                           f"the parameter digest of step {record['step']} covered no tensor "
                           f"({EMPTY_DIGEST}, the digest of nothing): the model given to "
                           "lockstep.track.log(model=...) holds no parameter it could read, "
                           "so replicas would agree on nothing")  # fmt: skip
    return None


def no_update(records: list[dict]) -> Problem | None:
    """The same parameter digest after every step not skipped."""
    logged = [(int(r["step"]), r["param_digest"]) for r in _in_order(records)
              if isinstance(r.get("param_digest"), str) and not skipped(r)]  # fmt: skip
    if len(logged) < 2 or len({d for _, d in logged}) > 1:
        return None
    (first, digest), (last, _) = logged[0], logged[-1]
    return Problem(NO_UPDATE, first, "param_digest", digest,
                   f"the parameter digest is {digest} after each of steps {first}..{last} "
                   f"({len(logged)} logged steps): no step changes a parameter, so the run does "
                   "not train (a learning rate of 0, no optimizer.step(), or an optimizer over "
                   "other parameters than the model's)")  # fmt: skip


def exploding_loss(records: list[dict]) -> Problem | None:
    """A finite loss over `EXPLODE_FACTOR` times the run's scale."""
    losses = [(int(r["step"]), number(r.get("loss"))) for r in _in_order(records)]
    losses = [(s, x) for s, x in losses if x is not None and math.isfinite(x)]
    if not losses:
        return None
    first = losses[0][1]
    scale = max(abs(first), LOSS_FLOOR)
    for step, x in losses[1:]:
        if abs(x) > EXPLODE_FACTOR * scale:
            return Problem(EXPLODING, step, "loss", repr(x),
                           f"loss is {x:.4g} at step {step}, over {EXPLODE_FACTOR:g} times its "
                           f"scale {scale:g} (the first loss {first:.4g}, at least {LOSS_FLOOR:g})"
                           ": the loss explodes while still finite (a learning rate far too "
                           "high, or no clipping)")  # fmt: skip
    return None


def not_training(records: list[dict]) -> Problem | None:
    """The first sign that the run does not train."""
    return (flat_loss(records) or zero_gradients(records) or empty_digest(records)
            or no_update(records) or exploding_loss(records))  # fmt: skip


def update_notes(records: list[dict]) -> list[str]:
    """A note when no parameter digest was logged."""
    if len(records) < 2 or any("param_digest" in r for r in records):
        return []
    return ["no parameter digest logged, so whether a step updates the parameters cannot be "
            "judged (pass model=model to lockstep.track.log)"]  # fmt: skip


def problem(records: list[dict], metrics: tuple[str, ...]) -> Problem | None:
    """The first reason this run cannot pass; None for a sound run."""
    return first_non_finite(records, metrics) or not_training(records)
