"""A node's channel between its leader and its other ranks (issue 38): real sockets in the
abstract namespace, every message signed; a forged or replayed check-in is named by the
leader, a forged message refused by the rank, a stalled leader named within the stall."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from lockstep.errors import LockstepError, RankTimeout, UsageError
from lockstep.preflight import node_channel
from lockstep.preflight.store import Refused, Signer

KEY = b"channel-test-job-key-32-bytes!!!"
OTHER_KEY = b"not-the-job-key-" * 2


def name(tag: str) -> bytes:
    return node_channel.name_of(os.getuid(), f"test-{tag}-{time.monotonic_ns()}", "h:1", "0")


def test_names_differ_by_job_and_by_node():
    one = node_channel.name_of(1000, "job.0", "10.0.0.1:29500", "0")
    assert one == node_channel.name_of(1000, "job.0", "10.0.0.1:29500", "0")
    assert one != node_channel.name_of(1000, "job.0", "10.0.0.1:29501", "0")  # another job
    assert one != node_channel.name_of(1000, "job.0", "10.0.0.1:29500", "1")  # another node
    assert one.startswith(b"\0")  # abstract: no file, gone with the leader


def test_the_leader_gathers_relays_and_names_what_it_refused():
    """3 ranks behind one leader: one honest, one with another key, one that replays an
    earlier check-in (not this leader's challenge). The honest one gets the answer and then
    the leader's failure (line and exit code); a second leader for the name is refused."""
    where = name("relay")
    lead = node_channel.Leader(where, Signer(KEY), "rank 0 on h0", 3)
    with pytest.raises(UsageError, match="another leader already serves"):
        node_channel.Leader(where, Signer(KEY), "rank 9 on h0", 1)
    honest = node_channel.Member(where, Signer(KEY), "rank 1 on h0", "its leader")
    forger = node_channel.Member(where, Signer(OTHER_KEY), "rank 2 on h0", "its leader")
    got: dict = {}

    def replay() -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(where)
        sock.recv(64)  # this leader's challenge, ignored: an earlier run's check-in is sent
        value = '{"local_rank": 3, "identity": {}, "fresh": "x", "challenge": "0000"}'
        data = Signer(KEY).seal(node_channel.key_of(where, "checkin"), "rank 3 on h0", value)
        sock.sendall(len(data).to_bytes(4, "big") + data)
        got["replayer"] = sock

    def member(m, local) -> None:
        m.check_in(local, {"rank": local}, 10)

    threads = [threading.Thread(target=member, args=(honest, 1)),
               threading.Thread(target=member, args=(forger, 2)), threading.Thread(target=replay)]  # fmt: skip
    for t in threads:
        t.start()
    identities = lead.gather(time.monotonic() + 10)
    for t in threads:
        t.join(10)
    assert identities == {1: {"rank": 1}}
    assert len(lead.refused) == 2, lead.refused
    assert any(r.startswith("forged value at node/") and "(claims rank 2 on h0)" in r
               for r in lead.refused), lead.refused  # fmt: skip
    assert any(r.startswith("replayed value at node/") and "(claims rank 3 on h0)" in r
               for r in lead.refused), lead.refused  # fmt: skip
    lead.send("answer", {"salt": "s"})
    assert honest.wait("answer", 5, 2, "the answer") == {"salt": "s"}
    lead.fail(RankTimeout("rank 0 on h9 did not answer"))
    with pytest.raises(LockstepError, match=r"^rank 0 on h9 did not answer$") as raised:
        honest.wait("verdict", 5, 2, "the verdict")
    assert raised.value.exit_code == 3
    lead.close()
    got["replayer"].close()


def test_a_forged_message_is_refused_and_a_stalled_leader_named():
    where = name("forged")
    lead = node_channel.Leader(where, Signer(KEY), "rank 0 on h0", 1)
    rank1 = node_channel.Member(where, Signer(KEY), "rank 1 on h0", "its node's leader (h0)")
    thread = threading.Thread(target=rank1.check_in, args=(1, {"rank": 1}, 10))
    thread.start()
    assert lead.gather(time.monotonic() + 10) == {1: {"rank": 1}}
    thread.join(10)
    lead.signer = Signer(OTHER_KEY)  # what another writer on the node would seal
    lead.send("verdict", 0)
    with pytest.raises(Refused, match=r"^preflight: forged value at node/"):
        rank1.wait("verdict", 5, 2, "the verdict")
    lead.signer = Signer(KEY)
    start = time.monotonic()  # beats that stop: the leader stalled
    with pytest.raises(RankTimeout, match=r"^its node's leader \(h0\) did not answer: no heart"):
        rank1.wait("verdict", 10, 0.5, "the verdict")
    assert time.monotonic() - start < 2
    lead.close()
