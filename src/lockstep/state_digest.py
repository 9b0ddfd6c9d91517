"""Exact digests of a model's state for the protocol's metrics lines (`lockstep.track.log`):
`param_digest` and `buffer_digest`, and the hooks of a check's run (`observe`) that read the
buffers as each step's forward enters the model, where DDP promises them equal, and carry the
local-batch watch (`lockstep.local_batch`). A base module: torch only, besides that watch.
"""

from __future__ import annotations

import hashlib
import os

_INT_VIEW = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


EMPTY_DIGEST = hashlib.sha256().hexdigest()[:16]  # what `digests` gives for no tensor at all


def _covered(t, gather: bool):
    """The tensor a digest covers. A parameter each rank holds a piece of (FSDP2's DTensor,
    ZeRO-3) is gathered to its full value when every rank digests (`gather`: a collective,
    so replicas compare the same thing), else this rank's own piece."""
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
    """Two exact integer checksums per tensor over its raw bits: the sum of the bit patterns
    and the sum of their squares, in int64 (integer sums do not depend on reduction order,
    so equal tensors give equal checksums on any device; wrap-around is deterministic)."""
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
    """One line per tensor: its name, shape, dtype and `_checksums` pair."""
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
    """`param_digest` alone (`digests`), over the model inside any wrapper (DDP's names
    without `module.`, as the hooks read it)."""
    from lockstep.local_batch import unwrap

    return _digest(_sums(unwrap(model)[-1].named_parameters(), gather))


def digests(model, gather: bool = False) -> dict[str, str]:
    """`param_digest` and `buffer_digest` of a module on this rank: 16 hex digits each, equal
    when every parameter (every buffer) is bitwise equal; `EMPTY_DIGEST` when it holds none.
    Costs two integer reductions per tensor and one transfer. Sharded parameters (DTensor,
    ZeRO-3) count by their full value with `gather` (every rank must call it then), else by
    this rank's shard (`_covered`)."""
    return {
        "param_digest": param_digest(model, gather),
        "buffer_digest": _digest(_sums(model.named_buffers(), gather)),
    }


def _buffer_fields(lines: list[str] | None) -> dict:
    """`buffer_digest` and each buffer's own (`buffers`) from `_sums`; none without lines."""
    if lines is None:
        return {}
    each = {line.split(":", 1)[0]: _digest([line]) for line in lines}
    return {"buffer_digest": _digest(lines), "buffers": each}


class EnteringBuffers:
    """The buffers `model` (the user's module, inside any wrapper) enters its first forward
    with after each `take`, when the caller holds the model (lockstep's reference job)."""

    def __init__(self, model):
        self.lines: list[str] | None = None
        self.handle = model.register_forward_pre_hook(self._pre)

    def _pre(self, module, args) -> None:
        if self.lines is None:
            self.lines = _sums(module.named_buffers(), False)

    def take(self) -> dict:
        """`buffer_digest` and `buffers` as `log` writes them; empty when no forward ran."""
        lines, self.lines = self.lines, None
        return _buffer_fields(lines)

    def close(self) -> None:
        self.handle.remove()


class _Observer:
    """Hooks on every module call of a check's run, from `protocol()` (else from the first
    `log`): the buffers each model enters its first forward of a step with, after a DDP
    wrapper's broadcast (where DDP promises them equal on every rank; after the step they
    differ by design), and the local-batch `Watch` while one is on."""

    def __init__(self, since: int):
        from lockstep import local_batch  # torch: not at import (`lockstep --help`)

        self.since = since
        self.unwrap = local_batch.unwrap
        self.chain: list = []  # the outermost call's wrappers, the user's model last
        self.entered: dict[int, list[str]] = {}  # id(model) -> `_sums` of its buffers
        # the parameters the run's first step entered with (a resume: what it loaded)
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
        """This step's observations for its metrics line, then a fresh step: the buffers
        `model` entered its forward with (by `buffer_digest`; each buffer's own in
        `buffers` when `each`), and the watch's findings. A watch that only looks (not
        switching anything off) covers one step. The run's first line also gets the
        parameters its forward entered with (`param_digest_in`)."""
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
    """Hook every module call from now on (once a process); `since`: the first step whose
    forwards the hooks see."""
    global _observer
    if _observer is None:
        _observer = _Observer(since)


def observed(model) -> dict:
    """What the hooks saw since the last call (`_Observer.take`); nothing before `observe`."""
    return _observer.take(model) if _observer is not None else {}


def stop_observing() -> None:
    """Remove the hooks (a test that logged in its own process)."""
    global _observer
    if _observer is not None:
        for handle in _observer.handles:
            handle.remove()
        _observer = None
