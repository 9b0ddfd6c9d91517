"""Where in the model two runs part, and whether a numeric difference is noise or a bug.

Only after a check has failed: the normal run installs nothing. The failure path replays the
runs with a `Recorder` on each (forward hooks on every module for its output, the gradients
the optimizer is about to step with, the parameters after the update), each tensor reduced to
a small `Digest` (float64 moments and a hash of its bytes, never the tensor), and
`first_difference` (pure) names the first step, pass and module where the two records part:
forward outputs in execution order, then gradients in backward order (reverse execution),
then parameters after the update.

`float64_verdict` (pure) reads a replay of both sides in float64: rounding noise (a reduction
order) shrinks by orders of magnitude, a real dependence does not; gradients that differ by
one common factor are named as a normalisation.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import struct
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

PASSES = ("forward", "backward", "update")
GOLDEN = 0.7548776662466927  # quasi-random weights for the projection moment


@dataclass(frozen=True)
class Digest:
    """A tensor in a few numbers: float64 sum, L2 norm, max |x|, a fixed projection, and a
    hash of its bytes (exact comparison)."""

    numel: int
    sum: float
    norm: float
    absmax: float
    proj: float
    sha: str

    def scaled(self, c: float) -> Digest:
        """The digest of c·x (the hash no longer applies)."""
        return Digest(self.numel, self.sum * c, self.norm * abs(c), self.absmax * abs(c),
                      self.proj * c, "")  # fmt: skip

    def short(self) -> str:
        return f"norm {self.norm:.9g}, sum {self.sum:.9g}, max|x| {self.absmax:.6g}"


@functools.lru_cache(maxsize=64)
def _weights(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64).mul_(GOLDEN).frac_().sub_(0.5)


def digest(t: torch.Tensor) -> Digest:
    if hasattr(t, "full_tensor"):  # a DTensor (FSDP2): the full value (collective)
        t = t.full_tensor()
    t = t.detach()
    raw = (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().contiguous()
    x = raw.to(torch.float64).flatten()
    w = _weights(x.numel())
    return Digest(
        x.numel(),
        float(x.sum()),
        float(x.norm()),
        float(x.abs().max()) if x.numel() else 0.0,
        float(x @ w),
        hashlib.blake2b(raw.numpy().tobytes(), digest_size=8).hexdigest(),
    )


def close(a: Digest, b: Digest, rtol: float, atol: float) -> bool:
    """Equal bytes when rtol = atol = 0; else every moment within tolerance of the larger
    norm (sum and projection can cancel, so they are held to the norm's scale)."""
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


@dataclass
class StepRecord:
    """One optimizer step's digests, each pass a list of (name, digest) in its order."""

    step: int
    forward: list[tuple[str, Digest]] = field(default_factory=list)
    backward: list[tuple[str, Digest]] = field(default_factory=list)
    update: list[tuple[str, Digest]] = field(default_factory=list)


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
    """The first (step, pass, name) whose digests differ, or None: steps in order, then
    forward, backward, update (those in `passes`). Pure."""
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


# ------------------------------------------------------------------------------ recording


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for item in out:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


class Recorder:
    """Digests of one model's passes, step by step. `module` is the user's (unwrapped) model
    as the engine runs it; `optimizer` the one that steps its parameters by those names (None
    for an engine whose optimizer holds flat partitions: forward and update only).

    Gradients are taken as the optimizer sees them (reduced, clipped); `end_step(clip_coef)`
    divides the clip coefficient back out, so one parameter's bad gradient is not hidden by
    the global rescale it causes. Parameters after the update come from `params_after`."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.module = module
        self.records: list[StepRecord] = []
        self.current = StepRecord(0)
        self.calls: dict[str, int] = {}
        self.order: list[str] = []  # modules in first-execution order (for backward order)
        self.handles = []
        self.on = True
        self.names = {id(p): n for n, p in module.named_parameters()}
        owner = {}
        for mname, m in module.named_modules():
            for pname, _ in m.named_parameters(recurse=False):
                owner[f"{mname}.{pname}" if mname else pname] = mname
        self.owner = owner
        for name, m in module.named_modules():
            self.handles.append(m.register_forward_hook(self._forward(name)))
        if optimizer is not None:
            self.handles.append(optimizer.register_step_pre_hook(self._grads))
        self.grads: list[tuple[str, Digest]] = []

    def _forward(self, name: str):
        def hook(module, args, out):
            if not self.on:
                return
            t = _first_tensor(out)
            if t is None or not t.is_floating_point():
                return
            k = self.calls.get(name, 0)
            self.calls[name] = k + 1
            if k == 0 and name not in self.order:
                self.order.append(name)
            self.current.forward.append((f"{name or '(model)'}#{k}", digest(t)))

        return hook

    def _grads(self, optimizer, args, kwargs) -> None:
        if not self.on:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = self.names.get(id(p))
                if name is not None and p.grad is not None:
                    self.grads.append((name, digest(p.grad)))

    def end_step(self, step: int, clip_coef: float = 1.0,
                 params_after: dict[str, torch.Tensor] | None = None) -> None:  # fmt: skip
        if self.on:
            rank = {m: i for i, m in enumerate(self.order)}
            grads = sorted(self.grads, key=lambda g: -rank.get(self.owner.get(g[0], ""), -1))
            c = 1.0 / clip_coef if clip_coef and clip_coef != 1.0 else 1.0
            self.current.backward = [(n, d.scaled(c) if c != 1.0 else d) for n, d in grads]
            if params_after is not None:
                self.current.update = [(n, digest(t)) for n, t in sorted(params_after.items())]
            self.current.step = step
            self.records.append(self.current)
        self.current, self.calls, self.grads = StepRecord(0), {}, []

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


# ------------------------------------------------------------------------------ float64


@dataclass(frozen=True)
class Verdict:
    kind: str  # "noise" | "dependence" | "factor" | "unavailable"
    text: str
    rel32: float | None = None
    rel64: float | None = None
    factor: float | None = None

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
    """Noise or bug from `metric` at the diverging step on both sides in fp32 (as the check
    saw it) and in the float64 replay; with the replay's (pre-clip) gradients, a common factor
    is named. Pure."""
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
    """Models, optimizer state and losses built inside come out in `dtype` (the replay)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def markdown(results) -> str:
    """The step summary's section for failed checks with forensics (`CheckResult`s): check,
    step, pass, module, verdict. Empty when none has any."""
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
                r.name, "pass" if r.passed else "FAIL", part.get("step", "—"),
                part.get("phase", "not reproduced"), part.get("name", "—"),
                verdict.get("text", "—"))) + " |"
        )  # fmt: skip
    return "\n".join(out)


def _float32_exact(x) -> bool:
    return isinstance(x, float) and struct.unpack("f", struct.pack("f", x))[0] == x


def judge(metric: str, rows32: tuple[dict, dict], rows64: tuple[dict, dict],
          grads64=None) -> Verdict:  # fmt: skip
    """`float64_verdict` on both sides' records at the diverging step; a metric the run
    keeps in float32 whatever the replay (both float64 values float32-exact) that differs by
    at most 4 float32 ulps is judged by the other metric's replay instead. Pure."""
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
