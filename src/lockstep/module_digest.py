"""Per-module digests of a model's forward, backward and update, step by step: what a failed
check's replay records (`track.watch`) and `checks.divergence` compares.

Design: docs/design/protocol.md#module-digests.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

PASSES = ("forward", "backward", "update")
GOLDEN = 0.7548776662466927  # quasi-random weights for the projection moment


@dataclass(frozen=True)
class Digest:
    """A tensor in a few float64 moments, and a hash of its bytes."""

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


@dataclass
class StepRecord:
    """One optimizer step's digests: (name, digest) per pass, in order."""

    step: int
    forward: list[tuple[str, Digest]] = field(default_factory=list)
    backward: list[tuple[str, Digest]] = field(default_factory=list)
    update: list[tuple[str, Digest]] = field(default_factory=list)

    def to_json(self) -> dict:
        """`step`, then each pass as [[name, digest], ...]."""
        return {"step": self.step} | {
            pass_: [[n, asdict(d)] for n, d in getattr(self, pass_)] for pass_ in PASSES
        }

    @classmethod
    def from_json(cls, raw: dict) -> StepRecord:
        passes = {p: [(n, Digest(**d)) for n, d in raw.get(p, [])] for p in PASSES}
        return cls(int(raw["step"]), **passes)


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
    """Digests of one unwrapped model's passes; without `optimizer` (flat partitions), forward
    and update only. `end_step` divides the clip coefficient out of the gradients."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.module = module
        self.records: list[StepRecord] = []
        self.current = StepRecord(0)
        self.calls: dict[str, int] = {}
        self.order: list[str] = []  # first-execution order: backward's is its reverse
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
