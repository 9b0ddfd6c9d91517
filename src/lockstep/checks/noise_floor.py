"""The noise floor: how far reordering its fp32 sums alone moves a run, and a difference
between two runs judged against it. Design: docs/design/checks.md.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass

K = 10.0  # the runs compared and the perturbed run start a few ulps apart
METRICS = ("loss", "grad_norm")

# A script's perturbed runs; on a GPU the vector width moves no kernel, the cuBLAS settings do.
PERTURBATIONS: tuple[dict[str, str], ...] = (
    {"ATEN_CPU_CAPABILITY": "default", "CUBLAS_WORKSPACE_CONFIG": ":0:0"},
    {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2", "TORCH_BLAS_PREFER_CUBLASLT": "1"},
)
PERTURBED = "fp32 reordering (ATen vector width, intra-op threads; on a GPU the GEMM kernels)"


def relative(a, b) -> float | None:
    """|a - b| relative to the larger; None unless both are finite numbers."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b)):
        return None
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


@dataclass(frozen=True)
class Floor:
    """Per metric, per step: the largest relative difference a perturbed run showed."""

    steps: dict[str, dict[int, float]]
    how: str = PERTURBED

    def at(self, metric: str, step: int) -> float:
        """The floor of `metric` up to `step`; 0 when reordering never moved it."""
        seen = self.steps.get(metric, {})
        nonzero = [s for s, f in sorted(seen.items()) if f > 0]
        if not nonzero:
            return 0.0
        upto = max(step, nonzero[0])
        return max(f for s, f in seen.items() if s <= upto)

    def largest(self) -> float:
        return max((f for m in self.steps.values() for f in m.values()), default=0.0)

    def to_dict(self) -> dict:
        return {"how": self.how, "steps": {m: dict(v) for m, v in self.steps.items()}}


def measure(base: list[dict], perturbed: list[list[dict]], metrics=METRICS) -> Floor:
    """The floor from `base` and its perturbed runs (lists of metric rows). Pure."""
    steps: dict[str, dict[int, float]] = {m: {} for m in metrics}
    rows = {int(r["step"]): r for r in base}
    for other in perturbed:
        for r in other:
            s = int(r["step"])
            for m in metrics:
                rel = relative(rows.get(s, {}).get(m), r.get(m))
                if rel is not None:
                    steps[m][s] = max(steps[m].get(s, 0.0), rel)
    return Floor(steps)


@dataclass(frozen=True)
class Judgement:
    """`kind`: "noise" (within K x the floor), "beyond" (a failure) or "zero" (a metric differs
    where reordering never moved it: not judged)."""

    kind: str
    text: str
    step: int | None = None
    metric: str | None = None
    difference: float | None = None
    floor: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.difference is None or not self.floor:
            return None
        return self.difference / self.floor

    def to_dict(self) -> dict:
        return asdict(self) | {"ratio": self.ratio, "k": K}


def judge(a: list[dict], b: list[dict], floor: Floor, rtol: float = 0.0, atol: float = 0.0,
          metrics=METRICS) -> Judgement:  # fmt: skip
    """`a` against `b`: the first difference beyond rtol/atol and K x the floor, else one it
    cannot judge, else the largest ratio. Pure."""
    rows = {int(r["step"]): r for r in b}
    worst: Judgement | None = None
    unjudged: Judgement | None = None
    for r in sorted(a, key=lambda r: int(r["step"])):
        s = int(r["step"])
        for m in metrics:
            x, y = r.get(m), rows.get(s, {}).get(m)
            rel = relative(x, y)
            if rel is None or rel == 0 or abs(x - y) <= atol + rtol * abs(x):
                continue
            f = floor.at(m, s)
            if f == 0:
                unjudged = unjudged or Judgement("zero", "", s, m, rel, 0.0)
                continue
            here = Judgement("noise", "", s, m, rel, f)
            if rel > K * f:
                return _worded(Judgement("beyond", "", s, m, rel, f))
            if worst is None or here.ratio > worst.ratio:
                worst = here
    if unjudged is not None:
        return _worded(unjudged)
    if worst is None:
        return Judgement("noise", "no difference beyond the tolerance")
    return _worded(worst)


def _worded(j: Judgement) -> Judgement:
    where = f"{j.metric} differs by {j.difference:.2g} relative at step {j.step}"
    if j.kind == "zero":
        text = (
            f"{where}, but fp32 reordering alone never moved {j.metric} (noise floor zero): "
            "the floor cannot judge it"
        )
    else:
        relation = "within" if j.kind == "noise" else "beyond"
        text = (
            f"{where}; fp32 reordering alone moves it {j.floor:.2g} (noise floor); "
            f"{j.ratio:.2g}x the floor, {relation} {K:g}x"
        )
    return Judgement(j.kind, text, j.step, j.metric, j.difference, j.floor)


def other_thread_count() -> int:
    """An intra-op thread count other than this process's."""
    import torch

    return 2 if torch.get_num_threads() == 1 else 1


def other_blas_library():
    """On a GPU, the BLAS library (cuBLAS or cuBLASLt) this process does not prefer; else None."""
    import torch

    if not torch.cuda.is_available():
        return None
    now = torch.backends.cuda.preferred_blas_library().name.lower()
    return "cublas" if now == "cublaslt" else "cublaslt"


@contextlib.contextmanager
def reordered():
    """In-process perturbation: another intra-op thread count, on a GPU the other BLAS library."""
    import torch

    old = torch.get_num_threads()
    blas = other_blas_library()
    old_blas = torch.backends.cuda.preferred_blas_library() if blas else None
    torch.set_num_threads(other_thread_count())
    if blas:
        torch.backends.cuda.preferred_blas_library(blas)
    try:
        yield
    finally:
        torch.set_num_threads(old)
        if old_blas is not None:
            torch.backends.cuda.preferred_blas_library(old_blas)
