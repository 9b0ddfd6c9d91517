"""Rank 0's link code by columns (issue 38) against the same code on plain dicts: the records
opened from sealed rows as columns (`results.open_batch`) pair into the same links as each
rank's record dicts, and the statistics, the schedule's second plan and the report's section
read the same from a `stats.LinkList`'s kept columns as from a plain list of the same links."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from lockstep.preflight import collectives
from lockstep.preflight.links import results, schedule, section, stats
from lockstep.preflight.links.layout import Layout
from lockstep.preflight.links.pairing import Pairing
from lockstep.preflight.links.records import Records
from lockstep.preflight.store import Signer

SIGNER = Signer(b"k" * 32, "nonce")


def records(lay: Layout, rounds: list, offset: int, rng: random.Random, slow: set[int]):
    """Every rank's records of `rounds` (None: the intra-node round), some starved (with and
    without a ceiling), some one-way (a direction lost), some without their low reading."""
    out: dict[int, list[dict]] = {r: [] for r in range(len(lay.local))}
    for k, pairs in enumerate(rounds):
        peers = {}
        for a, b in [(None, None)] if pairs is None else pairs:
            nodes = range(len(lay.ranks)) if a is None else [a]
            for node in nodes:
                mine = (
                    lay.ranks[node]
                    if a is None
                    else list(zip(lay.ranks[a], lay.ranks[b], strict=True))
                )
                for i in range(0, len(mine) - 1, 2) if a is None else range(len(mine)):
                    x, y = (mine[i], mine[i + 1]) if a is None else mine[i]
                    peers[x], peers[y] = y, x
        for r, peer in peers.items():
            if rng.random() < 0.03:
                continue
            g = 100 * rng.uniform(0.9, 1.1) * (0.3 if lay.node_of(r) in slow else 1.0)
            rec = {"peer": peer, "round": offset + k, "intra": pairs is None,
                   "gbps_out": g, "gbps_low_out": g * rng.uniform(0.8, 1.0),
                   "latency_us": rng.uniform(5, 9), "reps": 5, "starved_reps": 0,
                   "extra_reps": rng.choice([0, 1]), "cpu_wait_known": rng.random() < 0.9}  # fmt: skip
            if rng.random() < 0.1:
                rec |= {"starved": rng.uniform(0.3, 0.9), "starved_reps": 5,
                        "gbps_out": g * rng.uniform(0.2, 1.0)}  # fmt: skip
                if rng.random() < 0.7:
                    rec["gbps_ceiling_out"] = 2 * g
            if rng.random() < 0.05:
                del rec["gbps_low_out"]
            out[r].append(rec)
    return out


def opened(records_of: dict[int, list[dict]], name: str, rounds: range) -> Records:
    world = len(records_of)
    rows = np.array(
        [
            np.frombuffer(
                collectives.seal_bytes(SIGNER, name, r, results.pack(records_of[r], len(rounds))),
                dtype=np.uint8,
            )
            for r in range(world)
        ]
    )
    batch, refused = results.open_batch(SIGNER, name, rows, world=world, rounds=rounds)
    assert refused == {}
    out = Records()
    out.add(batch)
    return out


@pytest.mark.parametrize(("nodes", "per", "seed"), [(4, 2, 0), (12, 2, 1), (40, 4, 2), (70, 1, 3)])
def test_columns_and_dicts_give_the_same_links_plan_and_section(nodes, per, seed):
    rng = random.Random(seed)
    world = nodes * per
    lay = Layout(
        hosts=[f"n{k}" for k in range(nodes)],
        ranks=[[k * per + i for i in range(per)] for k in range(nodes)],
        local=[r % per for r in range(world)],
    )
    kind, first = schedule.schedule(nodes)
    rounds = [None, *first]
    slow = {nodes // 3}
    recs = records(lay, rounds, 0, rng, slow)
    by_columns, by_dicts = Pairing(lay), Pairing(lay)
    cols = by_columns.links(opened(recs, "p1", range(len(rounds))))
    dicts = by_dicts.links(results.open_rows(SIGNER, "p1", _rows(recs, "p1", len(rounds)),
                                             world=world, rounds=range(len(rounds)))[0])  # fmt: skip
    assert cols == dicts and cols[0] and (cols[1] or per == 1)
    # the statistics and the plan, from the columns kept and from plain dicts
    plain = [dict(x) for x in cols[0]]
    assert stats.best_of(cols[0]) == stats.best_of(plain)
    plan = schedule.second_plan(nodes, cols[0], sampled=kind == "sampled")
    assert plan == schedule.second_plan(nodes, plain, sampled=kind == "sampled")
    assert plan, "the slow node is measured again"
    # a second pass (pairs measured again: merged), then the section both ways
    more = records(lay, plan, len(rounds), rng, slow)
    cross, intra = by_columns.links(_both(opened(recs, "p1", range(len(rounds))), more, plan))
    plain_cross, plain_intra = [dict(x) for x in cross], [dict(x) for x in intra]
    got = [
        section.assess(
            hosts=lay.hosts,
            ranks=lay.ranks,
            local=lay.local,
            cross=c,
            intra=i,
            judge_intra=True,
            timeout_s=30,
            nbytes=1,
            elapsed_s=1.0,
        )
        for c, i in ((cross, intra), (plain_cross, plain_intra))
    ]
    assert json.dumps(got[0], sort_keys=True, default=list) == json.dumps(
        got[1], sort_keys=True, default=list
    )
    assert got[0]["findings"] == ["slow_node"] and got[0]["slow_nodes"][0]["node"] in slow


def _rows(records_of: dict[int, list[dict]], name: str, slots: int) -> np.ndarray:
    return np.array(
        [
            np.frombuffer(
                collectives.seal_bytes(SIGNER, name, r, results.pack(records_of[r], slots)),
                dtype=np.uint8,
            )
            for r in range(len(records_of))
        ]
    )


def _both(first: Records, more: dict[int, list[dict]], plan: list) -> Records:
    """The first pass's records and a second pass's, as the exchange holds them."""
    start = max(x["round"] for recs in first.values() for x in recs) + 1
    second = opened(more, "p2", range(start, start + len(plan)))
    first.add(second.batches[0])
    return first
