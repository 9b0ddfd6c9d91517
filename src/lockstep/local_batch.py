"""Dropout and local-batch BatchNorm, which make a model depend on how the batch is split over
ranks: found in a forward's torch calls, and switched off on request.
Design: docs/design/protocol.md#local-batch.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# "detect" (one step) or "neutralise" (every step)
MODE = "LOCKSTEP_LOCAL_BATCH"
DROPOUT, BATCHNORM = "dropout", "batchnorm"

# function -> p's position and name, the training flag's (None: always on)
_DROPOUT = {F.dropout: (1, "p", 2, "training"), F.alpha_dropout: (1, "p", 2, "training"),
            F.feature_alpha_dropout: (1, "p", 2, "training"),
            F.dropout1d: (1, "p", 2, "training"), F.dropout2d: (1, "p", 2, "training"),
            F.dropout3d: (1, "p", 2, "training"), torch.dropout: (1, "p", 2, "train"),
            F.scaled_dot_product_attention: (4, "dropout_p", None, None),
            F.multi_head_attention_forward: (10, "dropout_p", 13, "training")}  # fmt: skip


def _arg(args, kwargs, pos: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else default


def _set(args, kwargs, pos: int, name: str, value):
    if len(args) > pos:
        args = (*args[:pos], value, *args[pos + 1 :])
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


def unwrap(module: nn.Module) -> list[nn.Module]:
    """A wrapper and what it wraps, outermost first: the last is the user's model."""
    chain = [module]
    while len(chain) < 8:
        inner = [getattr(chain[-1], a, None) for a in ("module", "_forward_module")]
        inner = [m for m in inner if isinstance(m, nn.Module) and all(m is not c for c in chain)]
        if not inner:
            break
        chain.append(inner[0])
    return chain


class Watch(TorchFunctionMode):
    """Findings in the forwards it sees: {(kind, module): neutralised}; `enter` and `leave` go
    around every module call."""

    def __init__(self, neutralise: bool, since: int):
        super().__init__()
        self.neutralise = neutralise
        self.since = since  # the first step it watched
        self.found: dict[tuple[str, str], bool] = {}
        self.stack: list[nn.Module] = []
        self.names: dict[int, str] = {}

    def _where(self) -> str:
        for module in reversed(self.stack):
            name = self.names.get(id(module))
            if name is not None:
                return name or "(model)"
        return type(self.stack[-1]).__name__ if self.stack else "(outside any module)"

    def _note(self, kind: str, neutralised: bool) -> None:
        key = (kind, self._where())
        self.found[key] = self.found.get(key, True) and neutralised

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUT:
            p_pos, p_name, t_pos, t_name = _DROPOUT[func]
            p = _arg(args, kwargs, p_pos, p_name, 0.5 if t_pos is not None else 0.0)
            training = True if t_pos is None else _arg(args, kwargs, t_pos, t_name, True)
            if training and p and p > 0:
                self._note(DROPOUT, self.neutralise)
                if self.neutralise:
                    args, kwargs = _set(args, kwargs, p_pos, p_name, 0.0)
        elif func is F.batch_norm and self._local_batch_norm(args, kwargs):
            stats = _arg(args, kwargs, 1, "running_mean"), _arg(args, kwargs, 2, "running_var")
            frozen = self.neutralise and None not in stats
            self._note(BATCHNORM, frozen)
            if frozen:
                args, kwargs = _set(args, kwargs, 5, "training", False)
        return func(*args, **kwargs)

    def _local_batch_norm(self, args, kwargs) -> bool:
        """Batch statistics, not SyncBatchNorm's one-rank fallback."""
        sync = self.stack and isinstance(self.stack[-1], nn.SyncBatchNorm)
        return bool(_arg(args, kwargs, 5, "training", False)) and not sync

    def enter(self, module: nn.Module) -> None:
        if not self.stack:
            model = unwrap(module)[-1]
            self.names = {id(m): n for n, m in model.named_modules()}
            self.__enter__()
        self.stack.append(module)

    def leave(self) -> None:
        if self.stack:
            self.stack.pop()
            if not self.stack:
                self.__exit__(None, None, None)

    def record(self) -> dict:
        """The metrics line's `local_batch` field."""
        found = [[kind, name, done] for (kind, name), done in sorted(self.found.items())]
        return {"from": self.since, "found": found}


def describe(found) -> str:
    """'dropout in fc, head; BatchNorm in bn1' for (kind, module) pairs."""
    parts = []
    for kind, label in ((DROPOUT, "dropout"), (BATCHNORM, "BatchNorm")):
        modules = sorted({m for k, m in found if k == kind})
        if modules:
            more = f" and {len(modules) - 6} more" if len(modules) > 6 else ""
            shown = ", ".join(modules[:6]) + more
            parts.append(f"{label} in {shown}")
    return "; ".join(parts)


@contextlib.contextmanager
def watching(neutralise: bool):
    """A `Watch` over every module call inside."""
    watch = Watch(neutralise, 1)
    hooks = nn.modules.module
    pre = hooks.register_module_forward_pre_hook(lambda module, args: watch.enter(module))
    post = hooks.register_module_forward_hook(lambda m, a, o: watch.leave(), always_call=True)
    try:
        yield watch
    finally:
        pre.remove()
        post.remove()
        while watch.stack:
            watch.leave()


def findings(records) -> tuple[dict[tuple[str, str], bool], int | None]:
    """A run's findings from its metrics lines, and the first step watched."""
    found: dict[tuple[str, str], bool] = {}
    since = None
    for record in records:
        seen = record.get("local_batch")
        if not isinstance(seen, dict):
            continue
        since = seen.get("from") if since is None else since
        for kind, module, done in seen.get("found") or []:
            found[(kind, module)] = found.get((kind, module), True) and bool(done)
    return found, since
