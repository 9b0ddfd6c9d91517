"""The default process group of a launched rank: under torchrun, one store namespace per
attempt, so that restarted ranks never dial the dead ones. Design: docs/design/train.md."""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist


def attempt_prefix(store: dist.Store, rank: int, world: int) -> str:
    """The key prefix of this attempt's default group, the same on every rank of it."""
    while True:
        epoch = int(store.add("lockstep/epoch", 0))
        base = f"lockstep/epoch{epoch}"
        opened = store.compare_set(f"{base}/world", "", str(world))
        first = store.add(f"{base}/rank{rank}", 1) == 1
        if first and opened == str(world).encode():
            return base
        store.compare_set("lockstep/epoch", str(epoch), str(epoch + 1))


def init_launched_group(backend: str, timeout: timedelta) -> None:
    """`init_process_group` from a launcher's variables (`env://`), under torchrun's shared
    store in this attempt's own namespace."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(attempt_prefix(store, rank, world), store),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
