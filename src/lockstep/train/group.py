"""The default process group of a launched rank, one store namespace per torchrun attempt.

Under torchrun with TCPStore sharing (torch's default: `TORCHELASTIC_USE_AGENT_STORE=True`)
every rank's `env://` store is a client of one TCPStore that the agent of group rank 0 in
the first rendezvous round serves for the whole job. After a restart it still holds the previous attempt's keys of the
default group (gloo's and nccl's peer addresses), so restarted ranks would dial the dead
ones ("Connection refused"). Each attempt therefore gets its own key prefix.

The prefix must be the same on every node. `TORCHELASTIC_RESTART_COUNT` is not: each agent
counts its own restarts, and an agent that restarts its workers because another node failed
or joined does not count it (on one host there is one agent, so it agrees with itself). The
rendezvous round is not in that store either (the agents' rendezvous keys live in the
c10d endpoint's store, the workers never see it). So the ranks agree on an epoch
in the store itself: an epoch is fresh for a rank when that rank has not joined it before and
it was opened for this world size; otherwise the rank moves `lockstep/epoch` on by one (all
ranks of the previous attempt are gone before torchrun starts the next one's).
"""

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
