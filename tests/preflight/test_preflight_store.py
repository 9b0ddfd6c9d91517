"""The signed store on a real TCPStore, in one process: what `Store` writes it reads back;
what another writer put there (a changed byte, another key, an earlier run's nonce, bytes
that parse as nothing) is refused by name, one value at a time or many at once."""

from __future__ import annotations

import pytest

from lockstep.launch import free_port
from lockstep.preflight.store import BATCH, CheckIn, Refused, Signer, connect

KEY = b"a1" * 16
MESSAGES = {"unreachable": "-", "cannot_serve": "-", "name": "-"}


@pytest.fixture(scope="module")
def served():
    store = connect("127.0.0.1", free_port(), serve=True, timeout_s=5, reach_s=1, messages=MESSAGES)
    yield store.prefixed("lockstep/test")


def honest(store, nonce="n" * 32):
    return store.signed(Signer(KEY, nonce), "rank 1 on ls1")


def test_values_round_trip_and_many_are_read_in_one_call(served):
    store = honest(served)
    store.put("a", {"gbps": 1.5})
    store.put("b", [1, 2])
    assert store.get("a") == {"gbps": 1.5}
    assert store.get_many(["a", "b"]) == [{"gbps": 1.5}, [1, 2]]


def test_what_another_writer_put_is_refused_by_name(served):
    store = honest(served)
    store.put("c", 7)
    raw = bytes(served.raw.get("c"))
    served.raw.set("changed", raw.replace(b"\n7", b"\n8"))
    served.raw.set("garbage", b'{"node": 1')
    served.raw.set(
        "other-key",
        Signer(b"b2" * 16, "n" * 32).seal("lockstep/test/other-key", "rank 1 on ls1", "7"),
    )
    served.raw.set(
        "earlier", Signer(KEY, "e" * 32).seal("lockstep/test/earlier", "rank 1 on ls1", "7")
    )
    served.raw.set("moved", raw)  # a value signed for another key
    expect = {
        "changed": "forged value at lockstep/test/changed (claims rank 1 on ls1): its MAC",
        "garbage": "malformed value at lockstep/test/garbage (claims no sender)",
        "other-key": "forged value at lockstep/test/other-key (claims rank 1 on ls1)",
        "earlier": "replayed value at lockstep/test/earlier (claims rank 1 on ls1): signed for "
        "another run",
        "moved": "forged value at lockstep/test/moved",
    }
    for key, message in expect.items():
        with pytest.raises(
            Refused, match="^preflight: " + message.replace("(", r"\(").replace(")", r"\)")
        ):
            store.get(key)
    with pytest.raises(Refused, match="lockstep/test/garbage"):
        store.get_many(["c", "garbage"])
    assert store.get("c") == 7


def test_a_check_in_gathers_in_batches_and_names_each_forged_post(served):
    """Rank 0 reads the posts a batch per call (issue 38); a forged post refused by name, a
    missing one left out, the honest ones in the same batch kept."""
    store, n = honest(served.prefixed("gather")), BATCH + 3
    board = CheckIn(store, "checkin")
    for k in range(n):
        if k != 5:  # never posted
            board.post(k, {"k": k})
    raw = bytes(served.raw.get("gather/checkin/post/7"))
    served.raw.set("gather/checkin/post/7", raw.replace(b'"k": 7', b'"k": 8'))
    board = CheckIn(store, "checkin")
    got = board.gather(n, 0, lambda v: isinstance(v, dict))
    assert sorted(got) == [k for k in range(n) if k not in (5, 7)]
    assert got[BATCH + 2] == {"k": BATCH + 2}
    assert list(board.refused) == [7]
    assert "forged value at lockstep/test/gather/checkin/post/7" in board.refused[7].detail


def test_without_a_key_values_travel_unsigned_and_a_keyed_reader_refuses_them(served):
    plain = served.signed(Signer(None), "rank 2 on ls2")
    plain.put("unsigned", 1)
    assert plain.get("unsigned") == 1 and not plain.signer.authenticated
    with pytest.raises(Refused, match=r"forged value .* it is unsigned"):
        honest(served).get("unsigned")


def test_a_host_name_that_resolves_to_loopback_here_listens_on_every_interface():
    """Debian's `127.0.1.1 HOSTNAME`: the other nodes resolve the name to this node's address,
    so binding loopback would shut them out; an address written out is kept."""
    import socket

    from lockstep.preflight.store import listen

    name = socket.gethostname()
    if not socket.gethostbyname(name).startswith("127."):
        pytest.skip(f"this host's name {name} does not resolve to loopback here")
    for host, bound in ((name, "0.0.0.0"), ("127.0.0.1", "127.0.0.1")):
        fd, _ = listen(host, free_port())
        with socket.socket(fileno=fd) as sock:
            assert sock.getsockname()[0] == bound, host
