"""The link stage's results travel by collective (issue 38): each pass's readings as a sealed
fixed-size row per rank, gathered to rank 0 in one `gather`; nothing of a healthy stage goes
through the store, and a row another key sealed, or one that is not readings, is refused and
named. Two real gloo ranks (the pool `test_preflight_links_p2p.py` uses too), standing for two
nodes, a small transfer."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lockstep.preflight import collectives
from lockstep.preflight.links import measure, results, stage
from lockstep.preflight.links.layout import Layout
from lockstep.preflight.store import Refused, Signer, Store

KEY = b"links-results-test-job-key-32by"
NONCE = "a" * 32
TWO_NODES = Layout(hosts=["h0", "h1"], ranks=[[0], [1]], local=[0, 0])
RECORD = {"peer": 1, "round": 1, "intra": False, "latency_us": 7.5, "gbps_out": 3.25,
          "gbps_low_out": 2.5, "reps": 3, "starved_reps": 3, "extra_reps": 1, "starved": 0.4,
          "cpu_wait_known": True}  # fmt: skip


class Recorded:
    """A real store, each call it gets written down (what the stage asked of the store)."""

    def __init__(self, raw):
        self.raw, self.calls = raw, []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args[0]))
            return getattr(self.raw, name)(*args)

        return call


def stores(tmp_path, rank: int, key: bytes = KEY) -> tuple[Recorded, Store]:
    raw = Recorded(dist.FileStore(str(tmp_path / "store"), 2))
    return raw, Store(raw, Signer(key, NONCE), f"rank {rank}")


def run(rank: int, store: Store):
    return stage.run_stage(
        dist, torch, torch.device("cpu"), store, rank=rank, lay=TWO_NODES, timeout_s=30,
        nbytes=64 << 10,
    )  # fmt: skip


@pytest.mark.distributed(world_size=2)
def test_a_pass_arrives_by_collective_and_leaves_nothing_in_the_store(rank, tmp_path):
    raw, store = stores(tmp_path, rank)
    started = time.monotonic()
    outcome = run(rank, store)
    assert outcome.failed is None
    assert raw.calls == []  # no link record, plan or status through the store
    if rank != 0:
        return
    assert sorted(outcome.records) == [0, 1]
    (mine,), (theirs,) = outcome.records[0], outcome.records[1]
    assert (mine["peer"], theirs["peer"], mine["round"]) == (1, 0, 1)
    links = stage.collect(store, outcome, world=2, identities=[], timeout_s=30, started=started,
                          min_link_gbps=None, judge_intra=False, nbytes=64 << 10)  # fmt: skip
    assert raw.calls == [("add", "links/end/count")]  # the one look at the status board
    (link,) = links["links"]
    assert (link["a"], link["b"], link["ranks"]) == (0, 1, [0, 1])
    assert math.isfinite(link["gbps"]) and link["gbps"] > 0 and link["latency_us"] > 0
    assert links["silent_ranks"] == [] and links["failed_ranks"] == {}


@pytest.mark.distributed(world_size=2)
def test_a_row_sealed_with_another_key_or_not_readings_is_refused_and_named(rank, tmp_path):
    for where in ("forged", "malformed"):
        (tmp_path / where).mkdir(exist_ok=True)
    _, store = stores(tmp_path / "forged", rank, KEY if rank == 0 else b"another-key" * 3)
    if rank == 0:
        with pytest.raises(Refused) as err:
            run(rank, store)
        assert str(err.value) == (
            "preflight: forged value at the links/pass1 row gathered from rank 1 (claims rank "
            "1): its MAC does not match the job key; refused"
        )
    else:  # nor does rank 0's answer (its abort) pass for one on a rank without the key
        with pytest.raises(Refused, match=r"forged value at the links/pass1 plan row .*rank 0"):
            run(rank, store)
    # a peer no rank has: the job's key, but not a reading
    row = {"name": "bad-peer", "run": lambda pair: {"peer": 7} if rank == 1 else {}}
    measure.register(measure.LinkMeasurement(**row))
    try:
        _, store = stores(tmp_path / "malformed", rank)
        if rank == 0:
            with pytest.raises(Refused, match=r"malformed value at the links/pass1 row gathered "
                               r"from rank 1 .*peer 7"):  # fmt: skip
                run(rank, store)
        else:  # rank 0's abort ends this rank's stage at once
            assert run(rank, store).failed == "rank 0 refused the links/pass1 rows of ranks 1"
    finally:
        del measure.MEASUREMENTS["bad-peer"]


def test_a_row_round_trips_every_reading_as_it_was_and_refuses_what_is_not_one():
    signer = Signer(KEY, NONCE)
    sealed = [results.pack([RECORD], 2), results.pack([], 2)]
    rows = np.array([np.frombuffer(collectives.seal_bytes(signer, "p", r, s), dtype=np.uint8)
                     for r, s in enumerate(sealed)])  # fmt: skip
    got, refused = results.open_rows(signer, "p", rows, world=2, rounds=range(2))
    assert refused == {} and got == {0: [RECORD], 1: []}
    assert {k: type(v) for k, v in got[0][0].items()} == {k: type(v) for k, v in RECORD.items()}
    for bad in ({"round": 5}, {"gbps_out": math.nan}, {"reps": 2.5}, {"peer": 0}):
        data = results.pack([{**RECORD, **bad}], 2)
        row = np.frombuffer(collectives.seal_bytes(signer, "p", 0, data), dtype=np.uint8)
        _, refused = results.open_rows(signer, "p", np.array([row, rows[1]]), world=2,
                                       rounds=range(2))  # fmt: skip
        assert list(refused) == [0] and refused[0].kind == "malformed", bad
    plan = results.Plan(rounds=[[(0, 3), (1, 2)], [(0, 1)]])
    assert results.Plan.of([*plan.ints(), 0, 0]) == plan
