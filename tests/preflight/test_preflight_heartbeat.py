"""Rank 0's heartbeat and the failure diagnosis done once at rank 0 (issue 38): on a real
TCPStore (libuv) with every value signed, and end to end on gloo ranks."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lockstep.errors import RankTimeout
from lockstep.preflight import heartbeat, silence
from lockstep.preflight.store import Signer, Store
from support.preflight_ranks import LAUNCH_TIMEOUT_S, by_hand, finish, on_nodes, stores_of

KEY = b"heartbeat-test-job-key-32-bytes!"


class Counted:
    """A real store client whose calls are counted (a check or multi_get of many keys: one)."""

    def __init__(self, raw):
        self.raw, self.ops = raw, 0

    def __getattr__(self, name):
        call = getattr(self.raw, name)

        def counted(*args, **kwargs):
            self.ops += 1
            return call(*args, **kwargs)

        return counted


@pytest.fixture
def server():
    raw = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False)
    made = Store(dist.PrefixStore("job", raw), Signer(KEY), "rank 0 on h0", "job/")
    made = made.begin_run(make=True, within_s=5)
    yield raw, made.signer.nonce


def client(server, rank: int, counted: bool = False) -> Store:
    raw, nonce = server
    conn = dist.TCPStore("127.0.0.1", raw.port, is_master=False, use_libuv=True,
                         timeout=timedelta(seconds=30))  # fmt: skip
    prefixed = dist.PrefixStore("job", conn)
    return Store(Counted(prefixed) if counted else prefixed, Signer(KEY, nonce), f"rank {rank}",
                 "job/")  # fmt: skip


def test_the_diagnosis_is_made_once_and_every_rank_reads_the_same_names(server):
    """40 ranks, 4 a host; ranks 36-39 never report in, rank 5's report is forged (unsigned):
    rank 0 names them from the check-in's identities in a few operations, each other rank
    reads the same line in a fixed number, whatever N (main's code: N checks a rank)."""
    n, silent = 40, {5, 36, 37, 38, 39}
    rank0 = client(server, 0, counted=True)
    beat = heartbeat.Heartbeat(rank0, 0.2, host="h0").start()
    others = {r: client(server, r, counted=True) for r in range(1, n) if r not in silent}
    forger = client(server, 5)
    forger.signer = Signer(None, forger.signer.nonce)
    forger.put("abort/5", 1)
    forger.add("abort/count")
    got: dict[int, object] = {}

    def rank(r: int) -> None:
        silence.report_in(others[r], r)
        watch = heartbeat.Watch(others[r], stall_s=2.0)
        got[r] = silence.await_diagnosis(others[r], watch, 10)

    threads = [threading.Thread(target=rank, args=(r,)) for r in others]
    for t in threads:
        t.start()
    silence.report_in(rank0, 0)
    ident = {"host": "", "address": None}
    text = silence.diagnose(rank0, n, lambda r: {**ident, "host": f"h{r // 4}"}, 1.0, beat)
    for t in threads:
        t.join(30)
    beat.stop()
    assert text == "rank 5 on h1; ranks 36-39 on h9", text
    assert got == dict.fromkeys(others, text)
    # each other rank: 6 operations (report in, the heartbeat, the diagnosis, read) and 2 a
    # beat while rank 0 waited; O(N) in all (main's code: every rank polled, then checked all
    # N keys: over N^2 = 1,600)
    each = [s.raw.ops for s in others.values()]
    assert max(each) <= 6 + 2 * beat.beats, (beat.beats, each)
    assert rank0.raw.ops + sum(each) < n * n / 2, (rank0.raw.ops, each)


def test_a_watch_waits_on_beats_and_names_a_stalled_rank_0(server):
    rank0, waiter = client(server, 0), client(server, 1)
    beat = heartbeat.Heartbeat(rank0, 0.2, host="node-a").start()
    watch = heartbeat.Watch(waiter, stall_s=0.6)
    threading.Timer(1.5, beat.posted, args=("verdict/answer",)).start()  # slow, beating
    start = time.monotonic()
    assert watch.wait_for("verdict/answer", 10)
    assert 1.4 < time.monotonic() - start < 3
    assert not watch.wait_for("other/answer", 0.5)  # the overall limit, beating: no answer
    beat.stop()
    start = time.monotonic()
    with pytest.raises(RankTimeout, match=r"^rank 0 on node-a did not answer: no heartbeat"):
        watch.wait_for("other/answer", 10, "the verdict")
    assert time.monotonic() - start < 0.6 + 1.5


def finish_timed(procs: dict) -> tuple[dict, dict[int, float]]:
    """`finish`, and when each rank printed its error line (time.time()): the moment it named
    who stalled, apart from its process's own teardown afterwards (3 ranks on a loaded 2-core
    machine took seconds to exit)."""
    named: dict[int, float] = {}
    errs: dict[int, list[str]] = {r: [] for r in procs}

    def read(r: int) -> None:
        for line in procs[r].stderr:
            if line.startswith("lockstep: error:") and r not in named:
                named[r] = time.time()
            errs[r].append(line)

    readers = [threading.Thread(target=read, args=(r,)) for r in procs]
    for t in readers:
        t.start()
    out = {}
    for r, proc in procs.items():
        stdout = proc.stdout.read()
        proc.wait(timeout=LAUNCH_TIMEOUT_S)
        out[r] = {"rc": proc.returncode, "out": stdout}
    for t in readers:
        t.join(LAUNCH_TIMEOUT_S)
    for r in procs:
        out[r]["err"] = "".join(errs[r])
    return out, named


def test_the_others_fail_on_a_stalled_rank_0_and_wait_for_a_slow_one(tmp_path):
    """Two jobs at once: rank 0 of one (2 nodes of 2 ranks: rank 0 is node 0's leader) stops
    its heartbeat and stalls before its verdict, the other's (2 ranks) is slower than --timeout
    but beats. Every rank of the first names rank 0 within the stall interval: rank 1 behind it
    on its node's channel, rank 2 (node 1's leader) by the heartbeat, rank 3 with the line its
    leader relays. On main's code the first's ranks waited --timeout for the verdict and named
    no host; the second's gave up on a busy rank 0.
    While the slow one's rank 0 waits, its two stores are read: the process group's keys (gloo's,
    one a rank) are in the store rank 0 serves for it alone, not in lockstep's (on main they
    shared lockstep's store)."""
    timeout = 10
    stall_s = heartbeat.intervals(timeout)[1]
    args = ["--timeout", str(timeout), "--no-links"]
    fault = heartbeat.FAULT_ENV
    placed = on_nodes(2, "stalled", range(4))
    placed[0][fault] = "stall:120"
    _, stalled = by_hand(4, range(4), tmp_path, args, per_rank_env=placed)
    port, slow = by_hand(
        2, [0, 1], tmp_path, args, per_rank_env={0: {fault: f"slow:{timeout + 1}"}}
    )
    try:
        protocol, group = stores_of(port, LAUNCH_TIMEOUT_S)
        pg_keys = [f"pg/0//cpu//0/{r}" for r in (0, 1)]  # gloo's rendezvous, under torch 2.x
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not group.check(pg_keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group.check(pg_keys), "the process group never met in its own store"
        assert not any(protocol.check([k]) for k in pg_keys), "the process group used lockstep's"
        assert protocol.check(["lockstep/preflight/./checkin/answer"])
        others, named_at = finish_timed({r: stalled[r] for r in (1, 2, 3)})
        stalled[0].kill()
        rank0_err = stalled[0].communicate(timeout=30)[1]
        results = finish(slow)
    finally:
        for proc in [*stalled.values(), *slow.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    planted = re.search(r"planted stall on rank 0 at ([\d.]+)", rank0_err)
    assert planted, rank0_err[-2000:]
    assert {r: res["rc"] for r, res in others.items()} == {1: 3, 2: 3, 3: 3}, others
    # one line of lockstep's each (torch logs its own wait that timed out, in lines of its own)
    lines = {r: [ln for ln in res["err"].splitlines() if not ln.startswith("[rank")]
             for r, res in others.items()}  # fmt: skip
    assert all(len(got) == 1 for got in lines.values()), lines
    assert re.match(r"^lockstep: error: its node's leader \(local rank 0 on \S+\) did not answer: "
                    r"no heartbeat from it for [\d.]+s while this rank waited for the verdict",
                    lines[1][0]), lines  # fmt: skip
    assert re.match(r"^lockstep: error: rank 0 on \S+ did not answer: no heartbeat from it for "
                    r"[\d.]+s while this rank waited for the verdict", lines[2][0]), lines  # fmt: skip
    assert lines[3] == lines[2], lines  # relayed by its leader, rank 2
    late = {r: round(t - float(planted.group(1)), 2) for r, t in named_at.items()}
    assert max(late.values()) < stall_s + 3, f"the ranks were slow to name rank 0: {late}"
    assert {r: res["rc"] for r, res in results.items()} == {0: 0, 1: 0}, results
    assert "planted slow on rank 0" in results[0]["err"]
