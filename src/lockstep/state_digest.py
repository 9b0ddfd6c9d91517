"""Exact digests of a model's parameters and buffers, and the hooks that read the buffers each
step enters with. Design: docs/design/protocol.md#state-digests.
"""

from __future__ import annotations

import hashlib
import os

_INT_VIEW = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


EMPTY_DIGEST = hashlib.sha256().hexdigest()[:16]  # of no tensor at all


def _covered(t, gather: bool):
    """A sharded tensor's full value with `gather`, else this rank's shard."""
    if type(t).__name__ == "DTensor":
        return t.full_tensor() if gather else t.to_local()
    if getattr(t, "ds_id", None) is not None:
        if not gather:
            return t.ds_tensor
        from deepspeed.runtime.zero import GatheredParameters

        with GatheredParameters([t]):
            return t.detach().clone()
    return t


def _checksums(tensors) -> list[int]:
    """Per tensor, int64 sums of its bit patterns and their squares."""
    import torch

    sums = []
    for t in tensors:
        t = t.detach()
        if t.numel() == 0:
            sums += [torch.zeros((), dtype=torch.int64, device=t.device)] * 2
            continue
        if t.dtype == torch.bool:
            bits = t.to(torch.int64)
        else:
            bits = t.contiguous().view(getattr(torch, _INT_VIEW[t.element_size()])).to(torch.int64)
        bits = bits.flatten()
        sums += [bits.sum(), (bits * bits).sum()]
    if not sums:
        return []
    return [int(x) for x in torch.stack([s.cpu() for s in sums]).tolist()]


def _sums(named, gather: bool) -> list[str]:
    """A line per tensor."""
    items = [(n, _covered(t, gather)) for n, t in named if t is not None]
    sums = _checksums(t for _, t in items)
    return [f"{name}:{tuple(t.shape)}:{t.dtype}:{sums[2 * i]}:{sums[2 * i + 1]}"
            for i, (name, t) in enumerate(items)]  # fmt: skip


def _digest(lines: list[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(f"{line}\0".encode())
    return h.hexdigest()[:16]


def param_digest(model, gather: bool = False) -> str:
    """`param_digest` of the model inside any wrapper."""
    from lockstep.local_batch import unwrap

    return _digest(_sums(unwrap(model)[-1].named_parameters(), gather))


def digests(model, gather: bool = False) -> dict[str, str]:
    """`param_digest` and `buffer_digest`, 16 hex digits each; with `gather`, on every rank."""
    return {
        "param_digest": param_digest(model, gather),
        "buffer_digest": _digest(_sums(model.named_buffers(), gather)),
    }


def _buffer_fields(lines: list[str] | None) -> dict:
    """`buffer_digest` and `buffers`, or none."""
    if lines is None:
        return {}
    each = {line.split(":", 1)[0]: _digest([line]) for line in lines}
    return {"buffer_digest": _digest(lines), "buffers": each}


class EnteringBuffers:
    """The buffers `model` enters its first forward with after each `take` (in process)."""

    def __init__(self, model):
        self.lines: list[str] | None = None
        self.handle = model.register_forward_pre_hook(self._pre)

    def _pre(self, module, args) -> None:
        if self.lines is None:
            self.lines = _sums(module.named_buffers(), False)

    def take(self) -> dict:
        """The fields `log` writes; empty when no forward ran."""
        lines, self.lines = self.lines, None
        return _buffer_fields(lines)

    def close(self) -> None:
        self.handle.remove()


class _Observer:
    """Hooks on every module call: the buffers each step enters with, and the `Watch`."""

    def __init__(self, since: int):
        from lockstep import local_batch  # torch: not at import (`lockstep --help`)

        self.since = since
        self.unwrap = local_batch.unwrap
        self.chain: list = []  # the outermost call's wrappers
        self.entered: dict[int, list[str]] = {}  # id(model) -> `_sums` of its buffers
        # the first step's parameters (a resume: what it loaded)
        self.first: dict[int, list[str]] | None = {} if since == 1 else None
        asked = os.environ.get(local_batch.MODE)
        self.watch = local_batch.Watch(asked == "neutralise", since) if asked else None
        self.depth = 0
        from torch.nn.modules import module as hooks

        self.handles = [hooks.register_module_forward_pre_hook(self._pre),
                        hooks.register_module_forward_hook(self._post, always_call=True)]  # fmt: skip

    def _pre(self, module, args) -> None:
        if self.depth == 0:
            self.chain = self.unwrap(module)
        self.depth += 1
        if module is self.chain[-1] and id(module) not in self.entered:
            self.entered[id(module)] = _sums(module.named_buffers(), False)
            if self.first is not None:
                self.first[id(module)] = _sums(module.named_parameters(), False)
        if self.watch is not None:
            self.watch.enter(module)

    def _post(self, module, args, out) -> None:
        self.depth = max(0, self.depth - 1)
        if self.watch is not None:
            self.watch.leave()

    def take(self, model) -> dict:
        """This step's fields, then a fresh step; a watch that only looks covers one step."""
        inner = id(self.unwrap(model)[-1]) if model is not None else None
        out = _buffer_fields(self.entered.get(inner))
        if self.first is not None and inner in self.first:
            out["param_digest_in"] = _digest(self.first[inner])
        self.entered, self.first = {}, None
        if self.watch is not None:
            out["local_batch"] = self.watch.record()
            if not self.watch.neutralise and not self.watch.stack:
                self.watch = None
        return out


_observer: _Observer | None = None


def observe(since: int) -> None:
    """Hook every module call (once a process), from step `since`."""
    global _observer
    if _observer is None:
        _observer = _Observer(since)


def observed(model) -> dict:
    """What the hooks saw since the last call."""
    return _observer.take(model) if _observer is not None else {}


def stop_observing() -> None:
    """Remove the hooks."""
    global _observer
    if _observer is not None:
        for handle in _observer.handles:
            handle.remove()
        _observer = None
