"""Preflight at scale (issue 38): rank 0's real code against N synthetic ranks.

    python benchmarks/bench_preflight_scale.py [--sizes 1024 4096 16384 65536] [--cap-s 120]
        [--per-node 8] [--procs 4] [--threads 8] [--collective-s 0.05] [--link-round-s 0.2]
        [--modes flat hier]

Real: the TCPStore (libuv, served by rank 0's process, as preflight serves it), the clients
(`--procs` x `--threads` TCPStore connections, connected one after another before any timing),
every value signed with one job key under the run's nonce by `preflight.store.Store` (the
synthetic ranks post through `checkin.post_node` and `CheckIn.post`, the ranks' own code), and
rank 0's code paths:
`checkin.answer_nodes` (check-in gather and answer), `collectives.open_bytes`/`open_ints` and
`compare.group_ranks` (the gathered digests and rows), `layout.layout` (the CPU part every rank
runs), `links.results.Exchange.close` (rank 0's side of each pass: every rank's sealed row
opened, the rest of the schedule decided and sealed for its broadcast), `links.stage.collect`
(the status board looked at once, `section.assess`),
`rank.read_fingerprints` + `compare.compare_ranks` + `verdict.build_report`, `report.emit`.
Emulated: the ranks themselves (N ranks' posts carried by the few clients above, written
before each timed phase: the time rank 0 waits for stragglers is not in the figures), the
transport of every collective (the all-gathers' results are handed to rank 0's code
directly; the link passes' gathered rows are copied into rank 0's buffer, in the phase), the
link measurements (healthy synthetic figures: 370 Gb/s +-5%, 8 ranks a node,
every rail measured as on GPUs). Collectives and link rounds are priced by the per-round cost
model printed beside the figures: ASSUMED, until measured on the bed.

The check-in runs two ways (`--modes`): flat, every rank posting a record of its own (the
traffic of the protocol before the hierarchical check-in), and hierarchical (issue 38), one
record a node of `--per-node` ranks posted by its leader, with node 0's leader (rank 0) on its
real node channel (`node_channel`: `--per-node` - 1 ranks behind it as threads, the gather and
the relayed answer timed). The N/8 leaders' posts are carried by the same few clients.

Store operations: every call rank 0's `Store` makes to the TCPStore (a multi_get or a check of
many keys is one operation; the keys it carries are counted apart), and the synthetic ranks'.
A size whose timed phases pass `--cap-s` is reported as more than the cap.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lockstep.env import compare, fingerprint
from lockstep.preflight import (
    checkin,
    collectives,
    heartbeat,
    node_channel,
    rank,
    report,
    silence,
    verdict,
)
from lockstep.preflight.links import results, schedule
from lockstep.preflight.links import stage as link_stage
from lockstep.preflight.links.layout import layout
from lockstep.preflight.links.pairing import Pairing
from lockstep.preflight.local.check import result
from lockstep.preflight.local.registry import LOCAL_CHECKS
from lockstep.preflight.store import CheckIn, Signer, Store

KEY = b"bench-preflight-scale-job-key-32b"
PREFIX = "lockstep/preflight/bench.0"
GPU_NAME = "NVIDIA H100 80GB HBM3"
COLLECTIVE_ROUNDS = 11  # init, digests, 4 verified collectives, 3 all_reduce sizes, rows, layout


class Capped(Exception):
    """The timed phases passed --cap-s."""


class Counting:
    """The raw store, every call counted (rank 0's side of the traffic)."""

    def __init__(self, raw):
        self.raw, self.ops, self.keys = raw, 0, 0

    def _count(self, keys: int = 1) -> None:
        self.ops += 1
        self.keys += keys

    def set(self, key, value):
        self._count()
        return self.raw.set(key, value)

    def get(self, key):
        self._count()
        return self.raw.get(key)

    def multi_get(self, keys):
        self._count(len(keys))
        return self.raw.multi_get(keys)

    def check(self, keys):
        self._count(len(keys))
        return self.raw.check(keys)

    def add(self, key, amount):
        self._count()
        return self.raw.add(key, amount)

    def wait(self, keys, timeout):
        self._count(len(keys))
        return self.raw.wait(keys, timeout)


def host_of(r: int, per: int) -> str:
    return f"gpu-node-{r // per:05d}"


def identity(r: int, n: int, per: int, checks: list[dict]) -> dict:
    """What `identity.identity_of` posts, for a synthetic rank."""
    node = r // per
    return {
        "rank": r,
        "host": host_of(r, per),
        "address": f"10.{node >> 16 & 255}.{node >> 8 & 255}.{node & 255}",
        "node": node,
        "local_rank": r % per,
        "launcher": "srun",
        "world_size": n,
        "gpu": {"index": r % per, "name": GPU_NAME, "uuid": f"{r:08x}-0000-4000-8000-000000000000"},
        "checks": checks,
    }


def partners(rounds: list) -> list[dict[int, int] | None]:
    """Per round: node -> the node it pairs with (None: the intra-node round)."""
    return [
        None if pairs is None else {x: y for a, b in pairs for x, y in ((a, b), (b, a))}
        for pairs in rounds
    ]


def records(r: int, per: int, rounds: list, offset: int) -> list[dict]:
    """Rank r's link records for `rounds` (`partners`' maps), healthy figures."""
    rng = random.Random(r * 7919 + offset)
    node, rail = divmod(r, per)
    out = []
    for k, pairs in enumerate(rounds):
        if pairs is None:
            peer = r ^ 1 if (rail ^ 1) < per else None
        else:
            other = pairs.get(node)
            peer = None if other is None else other * per + rail
        if peer is None:
            continue
        out.append(
            {
                "peer": peer,
                "round": offset + k,
                "intra": pairs is None,
                "gbps_out": round(370 * rng.uniform(0.95, 1.05), 4),
                "latency_us": round(rng.uniform(6, 9), 2),
                "reps": 5,
                "starved_reps": 0,
                "extra_reps": 0,
                "starved": None,
                "cpu_wait_known": True,
            }
        )
    return out


def _writer(conn, lanes: list[int], lane_count: int, n: int, per: int, stagger_s: float) -> None:
    """One process of synthetic ranks: a TCPStore client per lane (thread), connected in turn;
    then, per wave asked, each lane posts for its ranks (r % lane_count == lane, r > 0)."""
    with contextlib.suppress(OSError):  # PR_SET_PDEATHSIG: end with the benchmark, never after
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    port, nonce, checks = conn.recv()
    stores: list[Store] = []
    for lane in lanes:
        time.sleep(stagger_s)
        raw = dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=True,
                            timeout=timedelta(seconds=600))  # fmt: skip
        prefixed = Counting(dist.PrefixStore(PREFIX, raw))
        stores.append(Store(prefixed, Signer(KEY, nonce), f"lane {lane}", PREFIX + "/"))
    conn.send("connected")
    while True:
        wave = conn.recv()
        if wave is None:
            return

        before = sum(s.raw.ops for s in stores)

        def post(lane: int, store: Store, wave=wave) -> None:
            # the check-in, the only wave left (the link results come by collective): `group`
            # ranks a record, 1 (flat) or a node's (leaders)
            group = wave[1]
            for first in range((lane or lane_count) * group, n, lane_count * group):
                ids = [identity(r, n, per, checks) for r in range(first, min(first + group, n))]
                store.by = f"rank {first} on {host_of(first, per)}"
                record = checkin.node_record(ids[0]["host"], first, ids, group, [], [])
                checkin.post_node(store, record)

        threads = [threading.Thread(target=post, args=x) for x in zip(lanes, stores, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.send(sum(s.raw.ops for s in stores) - before)


class Writers:
    """The synthetic ranks' clients, in `procs` processes of `threads` lanes."""

    def __init__(self, n: int, per: int, procs: int, threads: int, stagger_s: float):
        ctx = multiprocessing.get_context("fork")
        lanes = procs * threads
        self.pipes, self.procs, self.ops = [], [], 0
        for p in range(procs):
            mine, theirs = ctx.Pipe()
            args = (theirs, list(range(p * threads, (p + 1) * threads)), lanes, n, per, stagger_s)
            proc = ctx.Process(target=_writer, args=args, daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
        self.clients = lanes

    def connect(self, port: int, nonce: str, checks: list[dict]) -> None:
        for pipe in self.pipes:  # one process at a time: its connects are staggered
            pipe.send((port, nonce, checks))
            assert pipe.recv() == "connected"

    def wave(self, *what) -> float:
        """Every synthetic rank posts (wall seconds)."""
        start = time.perf_counter()
        for pipe in self.pipes:
            pipe.send(what)
        self.ops += sum(pipe.recv() for pipe in self.pipes)
        return time.perf_counter() - start

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(10)


class FakeGather:
    """The collective's transport, emulated: `all_gather` hands over every rank's row."""

    def __init__(self, rows: list[list[int]]):
        self.rows = torch.tensor(rows)

    def get_world_size(self) -> int:
        return len(self.rows)

    def all_gather_single(self, out, _mine) -> None:
        out.copy_(self.rows.view(-1))


class FakeP2P:
    """The link passes' gather and broadcast, emulated: rank 0's buffer gets `rows` (every
    rank's sealed row, `sealed_rows`); the broadcast goes nowhere."""

    def __init__(self):
        self.rows = None

    def gather(self, _mine, out, dst) -> None:
        for i, row in enumerate(out):
            row.copy_(self.rows[i])

    def broadcast(self, _tensor, src) -> None:
        pass


def sealed_rows(signer: Signer, name: str, n: int, per: int, rounds: list, offset: int):
    """Every synthetic rank's sealed row of a pass (`results.pack`), as rank 0 gathers them."""
    maps = partners(rounds)
    rows = [
        collectives.seal_bytes(
            signer, name, r, results.pack(records(r, per, maps, offset), len(rounds))
        )
        for r in range(n)
    ]
    return torch.from_numpy(np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(n, -1).copy())


class Timer:
    """Timed phases: each phase's seconds and rank 0's store operations; the cap over all."""

    def __init__(self, counting: Counting, cap_s: float):
        self.counting, self.left, self.phases = counting, cap_s, []

    @contextlib.contextmanager
    def phase(self, name: str):
        ops, keys, start = self.counting.ops, self.counting.keys, time.perf_counter()
        signal.signal(signal.SIGALRM, _capped)
        signal.setitimer(signal.ITIMER_REAL, max(self.left, 0.001))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.perf_counter() - start
            self.left -= took
            row = (name, took, self.counting.ops - ops, self.counting.keys - keys)
            self.phases.append(row)


def _capped(*_):
    raise Capped()


class Node0:
    """Node 0 on its real channel (`node_channel`): rank 0 its leader, `per - 1` ranks behind
    it (threads, each checking in and waiting for the relayed answer as a rank does)."""

    def __init__(self, n: int, per: int, checks: list[dict]):
        name = node_channel.name_of(os.getuid(), f"bench-{os.getpid()}-{n}", "127.0.0.1:0", "0")
        self.n, self.per, self.checks, self.answers = n, per, checks, {}
        self.leader = node_channel.Leader(
            name, Signer(KEY), f"rank 0 on {host_of(0, per)}", per - 1
        )
        self.members = {k: node_channel.Member(name, Signer(KEY), f"rank {k} on {host_of(0, per)}",
                                               "its node's leader") for k in range(1, per)}  # fmt: skip
        self.threads = [threading.Thread(target=self._rank, args=(k,)) for k in self.members]

    def _rank(self, k: int) -> None:
        self.members[k].check_in(k, identity(k, self.n, self.per, self.checks), 60)
        self.answers[k] = self.members[k].wait("answer", 600, 600, "the check-in's answer")

    def gather(self) -> list[dict]:
        """The leader's side of the check-in: its node's identities (its own first)."""
        for t in self.threads:
            t.start()
        got = self.leader.gather(time.monotonic() + 60)
        assert len(got) == self.per - 1, (got, self.leader.refused)
        return [identity(0, self.n, self.per, self.checks), *(got[k] for k in sorted(got))]

    def relay(self, answer: dict) -> None:
        self.leader.send("answer", answer)
        for t in self.threads:
            t.join(60)
        assert all(a == answer for a in self.answers.values()) and len(self.answers) == self.per - 1

    def close(self) -> None:
        self.leader.close()
        for m in self.members.values():
            m.close()


def run_size(n: int, per: int = 8, procs: int = 4, threads: int = 8, cap_s: float = 120.0,
             stagger_s: float = 0.002, hier: bool = False, out=sys.stdout) -> dict:  # fmt: skip
    """One emulated job of `n` ranks; the phases, the ops and the verdict. `hier`: the
    hierarchical check-in (one record a node of `per`, node 0's leader on its real channel);
    else every rank checks in for itself (the flat protocol's traffic)."""
    checks = [result(c.name, "ok", f"{c.name}: ok (synthetic)") for c in LOCAL_CHECKS.values()]
    writers = Writers(n, per, procs, threads, stagger_s)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                           wait_for_workers=False, timeout=timedelta(seconds=600))  # fmt: skip
    counting = Counting(dist.PrefixStore(PREFIX, server))
    store = Store(counting, Signer(KEY), "rank 0 on bench", PREFIX + "/")
    store = store.begin_run(make=True, within_s=10)
    timer, setup, got = Timer(counting, cap_s), {}, {"n": n, "capped": False, "hier": hier}
    node0 = Node0(n, per, checks) if hier else None
    try:
        start = time.perf_counter()
        writers.connect(server.port, store.signer.nonce, checks)
        setup["connect"] = time.perf_counter() - start
        group = per if hier else 1
        if node0 is not None:
            with timer.phase("node 0's leader: gather its ranks"):
                ids = node0.gather()
        else:
            ids = [identity(0, n, per, checks)]
        with timer.phase("node 0's leader: post its record"):
            board = checkin.post_node(store, checkin.node_record(ids[0]["host"], 0, ids, group,
                                                                 [], []))  # fmt: skip
        setup["checkin"] = writers.wave("checkin", group)
        fp = fingerprint.collect()
        ignored = compare.Ignored()
        digest = compare.section_digests(fp, ignored)
        sealed = [collectives.seal_bytes(store.signer, "digests", r, digest) for r in range(n)]
        row = [1, 1, 1, 1, 2_000_000, 9_000_000, 30_000_000, 12345]
        rows = [collectives.seal_ints(store.signer, "rows", r, row) for r in range(n)]
        hosts = [[*host_of(r, per).encode().ljust(64, b"\0"), r % per + 1] for r in range(n)]
        with timer.phase("check-in: gather, answer"):
            answer, seen = checkin.answer_nodes(board, n, 60.0, "srun", "nccl", None)
        assert not answer["missing"] and not answer["blocked"], answer
        if node0 is not None:
            with timer.phase("node 0's leader: relay the answer"):
                node0.relay(answer)
        with timer.phase("digests, rows: open, group"):
            digests = [collectives.open_bytes(store.signer, "digests", r, s) for r, s in
                       enumerate(sealed)]  # fmt: skip
            opened = [collectives.open_ints(store.signer, "rows", r, x) for r, x in enumerate(rows)]
            groups = compare.group_ranks(digests)
            store.put_text("fp/0", fingerprint.canonical_json(fp))
        gathered = FakeGather(hosts)  # the transport's part: every rank's row, at rank 0
        with timer.phase("layout (every rank)"):
            lay = layout(gathered, torch, torch.device("cpu"), 0)
        kind, first = schedule.schedule(len(lay.hosts))
        first_rounds, nodes, sampled = [None, *first], len(lay.hosts), kind == "sampled"
        p2p = FakeP2P()
        pairing = Pairing(lay)  # as `run_stage` keeps the first pass's links for the end
        exchange = results.Exchange(p2p, torch, torch.device("cpu"), store.signer, 0, n)
        p2p.rows = sealed_rows(store.signer, "links/pass1", n, per, first_rounds, 0)

        def second(got: dict) -> list:
            return link_stage.second_plan(lay, got, sampled=sampled, min_link_gbps=None,
                                          pairing=pairing)  # fmt: skip

        size = results.plan_ints(nodes, schedule.plan_rounds(nodes, sampled=sampled))
        mine = records(0, per, partners(first_rounds), 0)
        with timer.phase("links: first pass gathered, plan"):
            plan = exchange.close("links/pass1", mine, range(len(first_rounds)), second, size)
        rest = plan.rounds
        done = len(first_rounds)
        p2p.rows = sealed_rows(store.signer, "links/pass2", n, per, rest, done)
        mine = records(0, per, partners(rest), done)
        with timer.phase("links: second pass gathered, assess"):
            if rest:
                span, end = range(done, done + len(rest)), results.plan_ints(nodes, 0)
                exchange.close("links/pass2", mine, span, lambda _: [], end)
            identities = [seen[r] for r in range(n)]
            outcome = link_stage.Outcome(lay, exchange.records, pairing=pairing)
            section = link_stage.collect(store, outcome, world=n, identities=identities,
                                         timeout_s=60.0, started=time.monotonic(),
                                         min_link_gbps=None, judge_intra=True,
                                         nbytes=link_stage.GPU_BYTES)  # fmt: skip
        with timer.phase("verdict: fingerprints, compare, build"):
            fingerprints = rank.read_fingerprints(store, groups)
            measurements = [{"collectives": dict.fromkeys(collectives.COLLECTIVES, True),
                             "allreduce_seconds": [x / 1e9 for x in r[4:7]],
                             "matmul_checksum": r[7]} for r in opened]  # fmt: skip
            built = verdict.build_report(
                launcher="srun",
                backend="nccl",
                identities=identities,
                comparison=compare.compare_ranks(digests, fingerprints, identities, ignored),
                fingerprints=fingerprints,
                measurements=measurements,
                sizes=collectives.GPU_SIZES,
                links=section,
            )
        built.update(elapsed_s=0.0, authenticated=True)  # what rank._decide adds
        with timer.phase("report: --json, console"), tempfile.TemporaryDirectory() as tmp:
            with contextlib.redirect_stdout(io.StringIO()):
                report.emit(built, json_path=Path(tmp) / "report.json")
            got["json_bytes"] = (Path(tmp) / "report.json").stat().st_size
            CheckIn(store, "verdict").answer(built["exit_code"])
        got.update(exit_code=built["exit_code"], problems=built.get("problems", []))
        got["link_rounds"] = len(first_rounds) + len(rest)
    except Capped:
        got["capped"] = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        writers.close()
        if node0 is not None:
            node0.close()
    got.update(phases=timer.phases, setup=setup, rank0_ops=counting.ops, rank0_keys=counting.keys,
               ranks_ops=writers.ops, clients=writers.clients, cap_s=cap_s)  # fmt: skip
    got["measured_s"] = sum(p[1] for p in timer.phases)
    got["load"] = os.getloadavg()[0]
    return got


def show(got: dict, collective_s: float, link_round_s: float, out=sys.stdout) -> None:
    n = got["n"]
    load = got.get("load", os.getloadavg()[0])
    how = "hierarchical: one record a node" if got.get("hier") else "flat: one record a rank"
    print(
        f"\n== N={n:,} ranks ({n // 8:,} nodes of 8), check-in {how}, {got['clients']} real "
        f"clients, load average {load:.1f} at the end",
        file=out,
    )
    for name, secs in got["setup"].items():
        print(f"   setup (not timed) {name:<28} {secs:8.2f} s", file=out)
    print(f"   {'phase (rank 0, real code)':<40} {'s':>8} {'store ops':>10} {'keys':>8}", file=out)
    for name, secs, ops, keys in got["phases"]:
        print(f"   {name:<40} {secs:8.2f} {ops:10,} {keys:8,}", file=out)
    if got["capped"]:
        print(f"   MORE THAN THE CAP: {got['cap_s']:g} s (the phases after it not run)", file=out)
        return
    model = COLLECTIVE_ROUNDS * collective_s + got["link_rounds"] * link_round_s
    print(
        f"   measured {got['measured_s']:.2f} s; rank 0's store ops {got['rank0_ops']:,} "
        f"({got['rank0_keys']:,} keys), the ranks' {got['ranks_ops']:,}; exit code "
        f"{got['exit_code']}; --json {got['json_bytes'] / 1e6:.1f} MB\n"
        f"   cost model (ASSUMED, not measured): {COLLECTIVE_ROUNDS} collectives x "
        f"{collective_s:g} s + {got['link_rounds']} link rounds x {link_round_s:g} s = "
        f"{model:.1f} s; total {got['measured_s'] + model:.1f} s",
        file=out,
    )


def main_silent_ranks(store: Store, me: int, world: int, stop: float) -> int:
    """main's `rank._silent_ranks` before issue 38, on rank `me` (not rank 0), after every rank
    reported in (`silence.report_in`, the same two operations): poll the count (here: its
    deadline passed, one poll), check every rank's key, one call each, read each silent rank's
    check-in; `Capped` at `stop`. The silent ranks."""
    store.wait_count("abort/count", world, time.monotonic() - 1, every=0.2)
    silent = []
    for r in range(world):
        if time.monotonic() > stop:
            raise Capped()
        if not store.has(f"abort/{r}"):
            silent.append(r)
    for r in silent:
        CheckIn(store, "checkin").read(r)
    return len(silent)


def failure_path(n: int, per: int = 8, lanes: int = 32, cap_s: float = 30.0,
                 timeout_s: float = 1.0) -> dict:  # fmt: skip
    """After a collective failed, the last node's `per` ranks silent: every rank's store
    operations on the failure path, main's code (`main_silent_ranks`, capped) and now
    (`silence`: rank 0 diagnoses, the others read its diagnosis while its heartbeat goes on),
    each rank emulated on one of `lanes` real clients (threads: torch's store calls release
    the GIL). `timeout_s`: how long rank 0 waits for the silent ones to report in."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                           wait_for_workers=False, timeout=timedelta(seconds=600))  # fmt: skip
    got: dict = {"n": n, "silent": per}
    silent = set(range(n - per, n))
    for mode in ("main", "now"):
        base = dist.PrefixStore(f"{PREFIX}/{mode}", server)
        zero = Store(base, Signer(KEY), "rank 0 on bench", f"{PREFIX}/{mode}/")
        zero = zero.begin_run(make=True, within_s=10)
        counting = Counting(base)
        rank0 = Store(counting, zero.signer, zero.by, zero.prefix)
        clients = []
        for lane in range(lanes):
            raw = dist.TCPStore("127.0.0.1", server.port, is_master=False, use_libuv=True,
                                timeout=timedelta(seconds=600))  # fmt: skip
            wrapped = Counting(dist.PrefixStore(f"{PREFIX}/{mode}", raw))
            clients.append(Store(wrapped, zero.signer, f"lane {lane}", zero.prefix))
        for r in silent:  # they checked in, then went silent
            CheckIn(clients[r % lanes], "checkin").post(r, identity(r, n, per, []))
        ops0 = sum(c.raw.ops for c in clients)
        others = [r for r in range(1, n) if r not in silent]
        start, stop, capped = time.perf_counter(), time.monotonic() + cap_s, []
        beat, named = None, {}
        if mode == "now":
            beat_s = heartbeat.intervals(timeout_s)[0]
            beat = heartbeat.Heartbeat(zero, beat_s, host=host_of(0, per)).start()

        stall_s = heartbeat.intervals(timeout_s)[1]
        everyone = threading.Barrier(lanes)
        threads = [
            threading.Thread(
                target=_failure_lane,
                args=(mode, others[k::lanes], clients[k], n, timeout_s, stop, stall_s, named),
                kwargs={"capped": capped, "everyone": everyone},
            )
            for k in range(lanes)
        ]
        silence.report_in(rank0, 0)
        for t in threads:
            t.start()
        if mode == "now":
            text = silence.diagnose(rank0, n, lambda r: identity(r, n, per, []), timeout_s, beat)
        for t in threads:
            t.join()
        took = time.perf_counter() - start
        if beat is not None:
            beat.stop()
            assert set(named.values()) == {text}, set(named.values())
            got["named"] = text
        row = {"s": took, "capped": bool(capped), "rank0_ops": counting.ops,
               "ranks_ops": sum(c.raw.ops for c in clients) - ops0,
               "heartbeat_ops": 2 * beat.beats if beat else 0}  # fmt: skip
        if mode == "main":  # each other rank: put, add, a poll, N checks, `per` check-ins read;
            row["projected_ops"] = (n - per - 1) * (n + per + 3) + n + 3  # rank 0: no reads
        got[mode] = row
    return got


def _failure_lane(mode, mine, store, n, timeout_s, stop, stall_s, named, capped, everyone):
    """One client's share of the emulated ranks, on the failure path."""
    try:
        for r in mine:
            silence.report_in(store, r)
        if mode == "main":
            everyone.wait()  # the emulated ranks all reported in: now they poll and check
            for r in mine:
                main_silent_ranks(store, r, n, stop)
            return
        watch = heartbeat.Watch(store, stall_s)
        for r in mine:
            named[r] = silence.await_diagnosis(store, watch, 2 * timeout_s + 10)
    except Capped:
        capped.append(mine[0] if mine else None)


def show_failure(got: dict, timeout_s: float, out=sys.stdout) -> None:
    n = got["n"]
    print(f"\n== failure path, N={n:,} ranks, the last {got['silent']} silent "
          f"(rank 0 waits {timeout_s:g} s for them)", file=out)  # fmt: skip
    for mode, label in (("main", "main's _silent_ranks, every rank"), ("now", "rank 0 once")):
        row = got[mode]
        total = row["rank0_ops"] + row["ranks_ops"] + row["heartbeat_ops"]
        what = f"{total:,} store ops ({row['rank0_ops']:,} rank 0's, {row['heartbeat_ops']:,} "
        what += f"its heartbeat's, {row['ranks_ops']:,} the others')"
        if row["capped"]:
            what = f"MORE THAN THE CAP after {total:,} store ops"
        print(f"   {label:<34} {row['s']:8.2f} s  {what}", file=out)
        if "projected_ops" in row:
            print(f"   {'':<34} {'':>10}  all of it: {row['projected_ops']:,} ops, plus N x "
                  f"{timeout_s:g}/0.2 count polls at --timeout {timeout_s:g} (not emulated)",
                  file=out)  # fmt: skip
    print(f"   every rank names: {got.get('named')}", file=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--cap-s", type=float, default=120.0)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--collective-s", type=float, default=0.05)
    parser.add_argument("--link-round-s", type=float, default=0.2)
    parser.add_argument("--json", help="write every size's figures here")
    parser.add_argument(
        "--failure-path",
        action="store_true",
        help="only the failure path's store operations (main's code and now)",
    )
    parser.add_argument("--failure-cap-s", type=float, default=30.0)
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["flat", "hier"],
        default=["flat", "hier"],
        help="the check-in: every rank for itself (flat), one record a node (hier); both",
    )
    args = parser.parse_args()
    if args.failure_path:
        for n in args.sizes:
            show_failure(failure_path(n, args.per_node, cap_s=args.failure_cap_s), 1.0)
        return
    print(__doc__.split("\n\n")[2].replace("\n", " "))
    rows = []
    for n in args.sizes:
        for mode in args.modes:
            got = run_size(n, args.per_node, args.procs, args.threads, args.cap_s,
                           hier=mode == "hier")  # fmt: skip
            show(got, args.collective_s, args.link_round_s)
            rows.append(got)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
