"""Where every rank of the link stage is: its host and its local rank (its rail), and so its
partner in each round."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from functools import cached_property

from lockstep.compat import all_gather_single

_HOST_BYTES = 64


@dataclass(frozen=True)
class Layout:
    hosts: list[str]  # node index -> hostname, nodes ordered by their first rank
    ranks: list[list[int]]  # node -> its ranks, ordered by local rank (rail order)
    local: list[int]  # rank -> its local rank

    def node_of(self, rank: int) -> int:
        return self._where[rank][0]

    def rail_of(self, rank: int) -> int:
        return self._where[rank][1]

    def place(self, rank: int) -> tuple[int, int]:
        """(node, rail) of `rank`: both in one look-up."""
        return self._where[rank]

    @cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        """rank -> (node, rail): an index built once, not a scan of every node per rank (at
        64k ranks the scans took minutes, issue 38)."""
        return {r: (k, i) for k, rs in enumerate(self.ranks) for i, r in enumerate(rs)}


def layout(dist, torch, device, local_rank: int | None) -> Layout:
    """Every rank's host and local rank, by one all-gather of fixed size."""
    name = socket.gethostname().encode()[:_HOST_BYTES].ljust(_HOST_BYTES, b"\0")
    me = torch.tensor([*name, (local_rank if local_rank is not None else -1) + 1], device=device)
    world = dist.get_world_size()
    out = torch.empty(world * len(me), dtype=me.dtype, device=device)
    all_gather_single(dist, out, me)  # one tensor, not a list of one per rank (64k at scale)
    rows = out.view(world, len(me)).cpu().tolist()
    hosts_of = [bytes(r[:_HOST_BYTES]).rstrip(b"\0").decode(errors="replace") for r in rows]
    local = [r[-1] - 1 for r in rows]
    by_host = _group(hosts_of)
    ranks = [sorted(rs, key=lambda r: (local[r], r)) for rs in by_host.values()]
    return Layout(hosts=list(by_host), ranks=ranks, local=local)


def _group(hosts_of: list[str]) -> dict[str, list[int]]:
    """host -> its ranks in rank order, hosts in the order of their first rank (one pass)."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts_of):
        by_host.setdefault(h, []).append(r)
    return by_host


def layout_from_identities(identities: list[dict]) -> Layout:
    """The layout from the check-in's identities (rank 0's), where the stage's own exchange
    failed."""
    by_host: dict[str, list[int]] = {}
    for ident in identities:
        by_host.setdefault(ident["host"], []).append(ident["rank"])
    local = [i.get("local_rank") or 0 for i in identities]
    return Layout(hosts=list(by_host), ranks=list(by_host.values()), local=local)


def plan_partner(
    lay: Layout, rank: int, pairs: list[tuple[int, int]] | None, rails: int | None = None
) -> int | None:
    """This rank's peer in a round: `pairs` of node indices, or None for the intra-node round
    (rails 0-1, 2-3, ... of each node). Between nodes only local ranks below `rails` (None:
    all) take part."""
    node, rail = lay.node_of(rank), lay.rail_of(rank)
    if pairs is None:
        peer_rail = rail ^ 1
        mine = lay.ranks[node]
        return mine[peer_rail] if peer_rail < len(mine) else None
    if rails is not None and rail >= rails:
        return None
    for a, b in pairs:
        if node in (a, b):
            other = lay.ranks[b if node == a else a]
            return other[rail] if rail < len(other) else None
    return None


def stage_rails(device) -> int | None:
    """The local ranks measured between nodes: every rail on GPUs (NCCL gives each GPU its
    own NIC on a rail-optimised node), local rank 0 only on CPU: gloo sends every rank of a
    host through the same interface, so the other local ranks would measure that one NIC
    again, at once, each getting a share of it."""
    return None if device.type == "cuda" else 1
