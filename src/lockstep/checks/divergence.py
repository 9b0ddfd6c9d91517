"""Where in the model two recorded runs part (`first_difference`), and whether a numeric
difference is rounding noise or a bug (`float64_verdict`). Design: docs/design/checks.md.
"""

from __future__ import annotations

import contextlib
import math
import struct
from dataclasses import asdict, dataclass

import torch

from lockstep.module_digest import PASSES, Digest, StepRecord


def close(a: Digest, b: Digest, rtol: float, atol: float) -> bool:
    """Equal bytes when rtol = atol = 0; else every moment within tolerance of the larger
    norm (sum and projection can cancel)."""
    if a.numel != b.numel:
        return False
    if rtol == atol == 0 and a.sha and b.sha:
        return a.sha == b.sha
    scale = max(a.norm, b.norm)
    tol = atol * math.sqrt(max(a.numel, 1)) + rtol * scale
    bound = tol * math.sqrt(max(a.numel, 1))
    return (
        abs(a.norm - b.norm) <= tol
        and abs(a.absmax - b.absmax) <= tol
        and abs(a.sum - b.sum) <= bound
        and abs(a.proj - b.proj) <= bound
    )


@dataclass(frozen=True)
class Parting:
    """The first place two recorded runs part."""

    step: int
    pass_: str  # forward | backward | update
    name: str  # module (forward: "name#k", the k-th call in the step) or parameter
    expected: Digest | None
    actual: Digest | None
    rtol: float
    atol: float

    @property
    def module(self) -> str:
        return self.name.split("#")[0] or "(model)"

    def describe(self, a: str = "run1", b: str = "run2") -> str:
        what = {"forward": "output of module", "backward": "gradient of parameter",
                "update": "parameter after the update"}[self.pass_]  # fmt: skip
        tol = (
            "bitwise" if self.rtol == self.atol == 0 else f"rtol={self.rtol:g}, atol={self.atol:g}"
        )
        if self.expected is None or self.actual is None:
            return f"step {self.step}, {self.pass_}: {what} {self.name} recorded in one run only"
        return (
            f"step {self.step}, {self.pass_}: {what} {self.name} differs ({tol}): "
            f"{a} {self.expected.short()}; {b} {self.actual.short()}"
        )

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "phase": self.pass_,  # not "pass": redaction takes it for a password
            "module": self.module,
            "name": self.name,
            "expected": asdict(self.expected) if self.expected else None,
            "actual": asdict(self.actual) if self.actual else None,
            "rtol": self.rtol,
            "atol": self.atol,
        }


def first_difference(
    a: list[StepRecord], b: list[StepRecord], rtol: float = 0.0, atol: float = 0.0,
    steps: range | None = None, passes: tuple[str, ...] = PASSES,
) -> Parting | None:  # fmt: skip
    """The first (step, pass, name) whose digests differ, or None. Pure."""
    want, got = {r.step: r for r in a}, {r.step: r for r in b}
    for step in steps if steps is not None else sorted(set(want) & set(got)):
        if step not in want or step not in got:
            continue
        for pass_ in passes:
            x, y = getattr(want[step], pass_), getattr(got[step], pass_)
            ys = dict(y)
            for name, d in x:
                other = ys.get(name)
                if other is None or not close(d, other, rtol, atol):
                    return Parting(step, pass_, name, d, other, rtol, atol)
            xs = dict(x)
            for name, d in y:
                if name not in xs:
                    return Parting(step, pass_, name, None, d, rtol, atol)
    return None


# ------------------------------------------------------------------------------ float64


@dataclass(frozen=True)
class Verdict:
    kind: str  # "noise" | "dependence" | "factor" | "unavailable"
    text: str
    rel32: float | None = None
    rel64: float | None = None
    factor: float | None = None
    step: int | None = None  # the step judged, where a replay judged several

    def to_dict(self) -> dict:
        return asdict(self)


def _rel(a, b) -> float:
    if a is None or b is None:
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def common_factor(a: list[tuple[str, Digest]], b: list[tuple[str, Digest]],
                  rtol: float = 1e-6) -> float | None:  # fmt: skip
    """c when every gradient of `b` is c times `a`'s (norms and signed moments), else None."""
    ys = dict(b)
    ratios = []
    for name, d in a:
        e = ys.get(name)
        if e is None or d.numel != e.numel:
            return None
        if d.norm == 0 and e.norm == 0:
            continue
        if d.norm == 0:
            return None
        c = e.norm / d.norm * (-1.0 if d.proj * e.proj < 0 else 1.0)
        tol = rtol * abs(c) * d.norm * math.sqrt(d.numel)
        if abs(e.sum - c * d.sum) > tol or abs(e.proj - c * d.proj) > tol:
            return None
        ratios.append(c)
    if not ratios:
        return None
    c = ratios[0]
    return c if all(abs(r - c) <= rtol * abs(c) for r in ratios) else None


def float64_verdict(
    metric: str,
    fp32: tuple[float, float],
    fp64: tuple[float, float] | None,
    grads64: tuple[list[tuple[str, Digest]], list[tuple[str, Digest]]] | None = None,
    shrink: float = 1e-3,
) -> Verdict:
    """Noise or bug from `metric` on both sides in fp32 and in the float64 replay; with the
    replay's gradients, a common factor is named. Pure."""
    rel32 = _rel(*fp32)
    if fp64 is None:
        return Verdict("unavailable", "no float64 replay on this engine", rel32)
    rel64 = _rel(*fp64)
    factor = common_factor(*grads64) if grads64 else None
    if factor is not None and abs(factor - 1.0) > 1e-6:
        return Verdict(
            "factor",
            f"a normalisation bug: in a float64 replay every gradient of one side is "
            f"{factor:.6g} times the other's (one common factor), {metric} still differs by "
            f"{rel64:.2g} relative (fp32: {rel32:.2g})",
            rel32,
            rel64,
            factor,
        )
    if rel64 <= max(rel32 * shrink, 1e-12):
        return Verdict(
            "noise",
            f"rounding noise (reduction order): {metric} differs by {rel32:.2g} relative in "
            f"fp32 and by {rel64:.2g} when both sides replay in float64",
            rel32,
            rel64,
        )
    return Verdict(
        "dependence",
        f"a real dependence, not rounding: {metric} differs by {rel32:.2g} relative in fp32 "
        f"and still by {rel64:.2g} when both sides replay in float64",
        rel32,
        rel64,
    )


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Models, optimizer state and losses built inside come out in `dtype`."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def markdown(results) -> str:
    """The step summary's section for the results with forensics; empty when none has any."""
    from lockstep.summary_md import md_cell

    rows = [r for r in results if r.forensics]
    if not rows:
        return ""
    out = ["### Where the runs part", "",
           "| check | result | step | phase | module | noise or bug |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        part, verdict = r.forensics.get("parting") or {}, r.forensics.get("verdict") or {}
        out.append(
            "| " + " | ".join(md_cell(x) for x in (
                r.name, {"fail": "FAIL"}.get(r.verdict, r.verdict.replace("_", " ")),
                part.get("step", "—"),
                part.get("phase", "not reproduced"), part.get("name", "—"),
                verdict.get("text", "—"))) + " |"
        )  # fmt: skip
    return "\n".join(out)


def _float32_exact(x) -> bool:
    return isinstance(x, float) and struct.unpack("f", struct.pack("f", x))[0] == x


def judge(metric: str, rows32: tuple[dict, dict], rows64: tuple[dict, dict],
          grads64=None) -> Verdict:  # fmt: skip
    """`float64_verdict` on both sides' records; a metric kept in float32 whatever the replay
    is judged by the other metric's replay within 4 float32 ulps. Pure."""
    pair = lambda rows, m: (rows[0].get(m), rows[1].get(m))  # noqa: E731
    verdict = float64_verdict(metric, pair(rows32, metric), pair(rows64, metric), grads64)
    if verdict.kind != "dependence" or not all(map(_float32_exact, pair(rows64, metric))):
        return verdict
    a, b = pair(rows32, metric)
    other = "grad_norm" if metric == "loss" else "loss"
    if not all(isinstance(x, float) for x in (a, b, *pair(rows32, other), *pair(rows64, other))):
        return verdict
    ulps = abs(a - b) / (max(abs(a), 1e-300) * 2.0**-23)
    second = float64_verdict(other, pair(rows32, other), pair(rows64, other))
    if second.kind == "noise" and ulps <= 4:
        return Verdict(
            "noise",
            f"rounding noise: {metric} differs by {ulps:.2g} float32 ulp (kept in float32 "
            f"whatever the replay) and {second.text}",
            second.rel32,
            second.rel64,
        )
    return verdict
