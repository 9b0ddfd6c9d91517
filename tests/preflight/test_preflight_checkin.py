"""The hierarchical check-in (issue 38) on a real TCPStore (libuv), every value signed: each
node's leader posts one record, rank 0 reads them in batches and answers once; a forged, a
replayed and a malformed node record are named in the answer, never believed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lockstep.preflight import checkin
from lockstep.preflight.store import CheckIn, Signer, Store

KEY = b"checkin-test-job-key-32-bytes!!!"
OTHER_KEY = b"not-the-job-key-" * 2


@pytest.fixture
def rank0():
    raw = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False)
    made = Store(dist.PrefixStore("job", raw), Signer(KEY), "rank 0 on h0", "job/")
    return made.begin_run(make=True, within_s=5)


def leader(rank0: Store, by: str, signer: Signer | None = None) -> Store:
    conn = dist.TCPStore("127.0.0.1", rank0.raw.underlying_store.port, is_master=False,
                         use_libuv=True, timeout=timedelta(seconds=30))  # fmt: skip
    return Store(dist.PrefixStore("job", conn), signer or rank0.signer, by, "job/")


def ident(rank: int, host: str) -> dict:
    return {"rank": rank, "host": host, "address": None, "checks": []}


def record(host: str, ranks: list[int], world: int, missing=()) -> dict:
    return checkin.node_record(
        host, ranks[0], [ident(r, host) for r in ranks], world, list(missing), []
    )


def test_one_record_a_node_is_read_in_batches_and_answered_once(rank0):
    """Two nodes of 2 ranks and a third whose second rank never reached its leader: rank 0
    reads 3 records (not 6 check-ins), names rank 5 and its host, and each leader's answer
    echoes its own challenge."""
    board0 = checkin.post_node(rank0, record("h0", [0, 1], 2))
    boards = [checkin.post_node(leader(rank0, f"rank {r} on h{r // 2}"), rec)
              for r, rec in ((2, record("h1", [2, 3], 2)), (4, record("h2", [4], 2, [1])))]  # fmt: skip
    pg = {"host": "127.0.0.1", "port": 1}
    answer, identities = checkin.answer_nodes(board0, 6, 1.0, "torchelastic", "gloo", None, pg)
    assert sorted(identities) == [0, 1, 2, 3, 4] and answer["missing"] == [5]
    assert answer["leaders"] == [0, 2, 4] and answer["nonce"] == rank0.signer.nonce
    line = checkin.missing_line(answer, 6, 1.0)
    assert line.startswith("rank 5 of 6 never checked in within 1s")
    assert line.endswith("; on h2: local rank 1 of 2 never reached its node's leader"), line
    for board in boards:
        assert board.await_answer(5.0, checkin.is_answer)["missing"] == [5]


def test_a_forged_a_replayed_and_a_malformed_node_record_are_named(rank0):
    """Another writer posts a node's record under another key, an earlier run's record is
    replayed, a third slot holds bytes that parse as nothing: the answer blocks the job and
    names each, and none of their ranks is believed."""
    checkin.post_node(rank0, record("h0", [0, 1], 2))
    checkin.post_node(
        leader(rank0, "rank 2 on h1", Signer(OTHER_KEY, "f" * 32)), record("h1", [2, 3], 2)
    )
    checkin.post_node(leader(rank0, "rank 4 on h2", Signer(KEY, "e" * 32)), record("h2", [4, 5], 2))
    raw = leader(rank0, "x")
    slot = raw.add(checkin.SLOTS) - 1
    raw.raw.set(f"checkin/post/{slot}", b'{"host": ')
    raw.add("checkin/count")
    raw.add(checkin.RANKS, 2)
    board0 = CheckIn(rank0, "checkin")
    board0.post(99, {}, who="h0")  # rank 0's own board object: its slot does not matter here
    started = time.monotonic()
    answer, identities = checkin.answer_nodes(board0, 8, 30.0, "torchelastic", "gloo", None)
    assert time.monotonic() - started < 10  # decided on the (forged) count, not at --timeout
    blocked = answer["blocked"]
    assert "forged value at job/" in blocked and "(claims rank 2 on h1)" in blocked, blocked
    assert "replayed value at job/" in blocked and "(claims rank 4 on h2)" in blocked, blocked
    assert f"malformed value at job/{rank0.prefix[4:]}checkin/post/{slot}" in blocked, blocked
    assert sorted(identities) == [0, 1] and answer["missing"] == [2, 3, 4, 5, 6, 7]
