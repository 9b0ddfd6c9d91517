"""The link stage on the ranks: point-to-point bandwidth and latency between node pairs.

Every rank runs `run_stage` after the collectives. The ranks learn the layout (host and local
rank of each rank, one all-gather of fixed size), then walk the same schedule
(`link_verdict.schedule`): a first round within each node (local ranks 0-1, 2-3, ... at once
on every node), then rounds of disjoint node pairs. In a round, local rank i of one node pairs
with local rank i of the other (one NIC per GPU: each rail is measured; on CPU local rank 0
only, see `stage_rails`), every pair at once; a barrier keeps rounds apart. A pair first
ping-pongs a small message (latency), then each side sends `nbytes` to the other, timed until a
two-float ack (the sender's clock; best of `REPS`). torch.distributed send/recv: gloo on
CPU, NCCL on GPUs (the default process group's backend), timed with the stream synchronized.

CPU starvation: a rank waiting for a CPU moves data at the CPU's pace, not the link's. Each
side reads its process's run-queue wait around every transfer (`run_delays`: the sum over its
threads of /proc/self/task/*/schedstat's run_delay); the receiver sends its wait right after
the ack, in the same two-float tensor (a message of its own, so that no /proc read falls in the
timed span), and the sender knows both ends'. A transfer whose ends together waited more than
`link_verdict.STARVED_FRACTION` of it is starved; while every transfer of a direction was, the
sender asks for another (a one-float message says whether one comes), up to `EXTRA_REPS` more.
A direction starved in every transfer is recorded as such, and the verdict leaves it unjudged
rather than calling the link slow. Where /proc is unreadable the wait is unknown: not starved.

Timeouts: every op is bounded by the process group's timeout (`--timeout`). Each rank posts a
status in the store when it finishes or fails (the round and the peer it was waiting on); rank 0
waits at most the timeout plus a grace for all of them, and names the ranks that never posted
(a node that dropped out) instead of hanging. After the first pass its results go to rank 0,
which posts the rest (`link_verdict.second_plan`): the links that looked slow measured again
(none when nothing did), and beyond the full-matrix size the second pass (suspects paired with
good nodes).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

from lockstep.env import link_verdict

CPU_BYTES = 4 << 20  # 32 Mbit: 500 tbf bursts of 64 kbit on the bed; 34 ms at 1 Gbit/s
GPU_BYTES = 256 << 20
REPS = 2
EXTRA_REPS = 2  # more transfers while every one of a direction was starved: 4 at most
STARVED_PAUSE_S = 0.02  # the sender's pause before each of those: a burst of load may pass
LAT_ITERS = 8
_HOST_BYTES = 64
_POLL_S = 0.05
FAULT_ENV = "LOCKSTEP_LINKS_FAULT"  # tests: "hang:<round>" makes this rank stop answering


class LinkStageFailed(RuntimeError):
    """This rank's link stage ended early (a peer failed or stalled); rank 0 names who."""


@dataclass(frozen=True)
class Layout:
    hosts: list[str]  # node index -> hostname, nodes ordered by their first rank
    ranks: list[list[int]]  # node -> its ranks, ordered by local rank (rail order)
    local: list[int]  # rank -> its local rank

    def node_of(self, rank: int) -> int:
        return next(k for k, rs in enumerate(self.ranks) if rank in rs)

    def rail_of(self, rank: int) -> int:
        return self.ranks[self.node_of(rank)].index(rank)


def layout(dist, torch, device, local_rank: int | None) -> Layout:
    """Every rank's host and local rank, by one all-gather of fixed size."""
    name = socket.gethostname().encode()[:_HOST_BYTES].ljust(_HOST_BYTES, b"\0")
    me = torch.tensor([*name, (local_rank if local_rank is not None else -1) + 1], device=device)
    out = [torch.empty_like(me) for _ in range(dist.get_world_size())]
    dist.all_gather(out, me)
    rows = [r.cpu().tolist() for r in out]
    hosts_of = [bytes(r[:_HOST_BYTES]).rstrip(b"\0").decode(errors="replace") for r in rows]
    local = [r[-1] - 1 for r in rows]
    hosts: list[str] = []
    for h in hosts_of:
        if h not in hosts:
            hosts.append(h)
    ranks = [
        sorted((r for r, h in enumerate(hosts_of) if h == host), key=lambda r: (local[r], r))
        for host in hosts
    ]
    return Layout(hosts=hosts, ranks=ranks, local=local)


def plan_partner(
    lay: Layout, rank: int, pairs: list[tuple[int, int]] | None, rails: int | None = None
) -> int | None:
    """This rank's peer in a round: `pairs` of node indices, or None for the intra-node round
    (rails 0-1, 2-3, ... of each node). Between nodes only local ranks below `rails` (None:
    all) take part."""
    node = lay.node_of(rank)
    rail = lay.ranks[node].index(rank)
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


def run_delays() -> dict[str, int] | None:
    """This process's run-queue wait so far, per thread (ns): the second field of
    /proc/self/task/<tid>/schedstat (run_delay: time runnable but waiting for a CPU). None
    where unreadable (no /proc, no schedstat)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out or None


def waited_s(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """Seconds this process's threads waited for a CPU between two `run_delays` (a thread
    started in between counts from its start); None where either is unknown."""
    if before is None or after is None:
        return None
    return sum(max(0, ns - before.get(tid, 0)) for tid, ns in after.items()) / 1e9


def measure_pair(dist, torch, device, peer: int, first: bool, nbytes: int) -> dict:
    """Latency (half the median round trip of a small message) and this rank's send
    bandwidth to `peer` (best of REPS, until the peer's ack), with how many of its transfers
    were CPU-starved (see the module's docstring). Both sides call it."""
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    small = torch.zeros(2, dtype=torch.float32, device=device)
    flag = torch.zeros(1, dtype=torch.float32, device=device)
    big = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def ping(send_first: bool) -> None:
        if send_first:
            dist.send(small, peer)
            dist.recv(small, peer)
        else:
            dist.recv(small, peer)
            dist.send(small, peer)
        sync()

    ping(first)  # warm-up: NCCL builds this pair's communicator here
    rtts = []
    for _ in range(LAT_ITERS):
        t0 = time.perf_counter()
        ping(first)
        rtts.append(time.perf_counter() - t0)

    def transfer(sending: bool) -> tuple[float, float | None]:
        """One timed transfer, `big` then the ack: on the sender (seconds, the fraction of
        them both ends waited for a CPU, None where neither could tell); (0, None) on the
        receiver. Each side reads its wait around its part; /proc is read outside the timed
        span (about 15 us a thread: a GPU rank's dozens of threads would skew a fast link's
        reading), so the receiver's wait follows the ack in a message of its own."""
        sync()
        before = run_delays()
        t0 = time.perf_counter()
        if sending:
            dist.send(big, peer)
            dist.recv(small, peer)
        else:
            dist.recv(big, peer)
            dist.send(small, peer)
        sync()
        elapsed = time.perf_counter() - t0
        waited = waited_s(before, run_delays())
        if not sending:
            small[0] = -1.0 if waited is None else waited
            dist.send(small, peer)
            sync()
            return 0.0, None
        dist.recv(small, peer)
        sync()
        theirs = float(small[0].item())
        if waited is None and theirs < 0:
            return elapsed, None
        return elapsed, ((waited or 0.0) + max(theirs, 0.0)) / elapsed

    def one_way(sending: bool) -> dict:
        """REPS transfers, and up to EXTRA_REPS more while every one was starved; the sender
        decides and says so (`flag`) after each from the REPS-th on. The best of them all:
        starvation only slows a transfer, so a starved one faster than the rest still bounds
        the link's speed from below; `starved` only when every one was."""
        best, reps, starved, least, known = math.inf, 0, 0, math.inf, False
        while True:
            if sending and reps >= REPS:
                time.sleep(STARVED_PAUSE_S)
            elapsed, frac = transfer(sending)
            reps += 1
            if sending:
                best = min(best, elapsed)
                known = known or frac is not None
                if frac is not None and frac > link_verdict.STARVED_FRACTION:
                    starved += 1
                    least = min(least, frac)
            if reps < REPS:
                continue
            if sending:
                more = starved == reps and reps < REPS + EXTRA_REPS
                flag[0] = 1.0 if more else 0.0
                dist.send(flag, peer)
            else:
                dist.recv(flag, peer)
            sync()
            if not float(flag[0].item()):
                break
        return {
            "seconds": best,
            "reps": reps,
            "starved_reps": starved,
            "extra_reps": reps - REPS,
            "starved": round(least, 3) if starved == reps else None,
            "cpu_wait_known": known,
        }

    first_out = one_way(first)
    second_out = one_way(not first)
    sent = first_out if first else second_out
    return {
        "peer": peer,
        "gbps_out": round(nbytes * 8 / sent["seconds"] / 1e9, 4),
        "latency_us": round(statistics.median(rtts) / 2 * 1e6, 1),
        **{k: v for k, v in sent.items() if k != "seconds"},
    }


def _fault_round() -> int | None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec.startswith("hang:"):
        return int(spec.split(":", 1)[1])
    return None


def _run_rounds(dist, torch, device, lay, rank, rounds, nbytes, offset, records, rails) -> None:
    hang_at = _fault_round()
    for k, pairs in enumerate(rounds):
        index = offset + k
        if hang_at is not None and index >= hang_at:
            while True:  # a node that stops answering mid-stage (tests only)
                time.sleep(3600)
        peer = plan_partner(lay, rank, pairs, rails)
        if peer is not None:
            try:
                got = measure_pair(dist, torch, device, peer, rank < peer, nbytes)
            except Exception as err:
                raise LinkStageFailed(
                    f"round {index}: waiting on rank {peer}: {_line(err)}"
                ) from None
            got["round"] = index
            got["intra"] = pairs is None
            records.append(got)
        try:
            dist.barrier()
        except Exception as err:
            raise LinkStageFailed(f"round {index}: barrier: {_line(err)}") from None


def run_stage(
    dist,
    torch,
    device,
    store,
    *,
    rank: int,
    lay: Layout,
    timeout_s: float,
    nbytes: int | None = None,
    full_matrix: int | None = None,
    min_link_gbps: float | None = None,
) -> Layout:
    """This rank's part of the link stage; its results and status go to the store."""
    nbytes = nbytes or stage_bytes(device)
    full = full_matrix or int(
        os.environ.get("LOCKSTEP_LINKS_FULL_MATRIX", link_verdict.FULL_MATRIX)
    )
    rails = stage_rails(device)
    records: list[dict] = []
    try:
        n = len(lay.hosts)
        kind, rounds = link_verdict.schedule(n, full)
        all_rounds: list = [None, *rounds]  # None: the intra-node round
        _run_rounds(dist, torch, device, lay, rank, all_rounds, nbytes, 0, records, rails)
        if n > 1:  # the confirmation rounds, and beyond the full matrix the second pass
            store.set(f"links/pass1/{rank}", json.dumps(records))
            store.add("links/pass1/count", 1)
            plan = _second_plan(
                store, rank, lay, dist.get_world_size(), timeout_s, kind, min_link_gbps
            )
            offset = len(all_rounds)
            _run_rounds(dist, torch, device, lay, rank, plan, nbytes, offset, records, rails)
        status = {"state": "done"}
    except LinkStageFailed as err:
        status = {"state": "failed", "why": str(err)}
    store.set(f"links/res/{rank}", json.dumps(records))
    store.set(f"links/status/{rank}", json.dumps(status))
    store.add("links/status/count", 1)
    return lay


def write_outputs(section: dict, args) -> None:
    """Rank 0: `--exclude-out FILE` (a Slurm host list, empty when nothing is to be left out)
    and `--plot DIR` (links.png, the heatmap)."""
    from pathlib import Path

    path = getattr(args, "exclude_out", None)
    if path:
        Path(path).write_text(section["exclude_hostlist"] + ("\n" if section["exclude"] else ""))
    folder = getattr(args, "plot", None)
    if folder:
        from lockstep.env.link_plot import heatmap

        heatmap(section, Path(folder))


def _second_plan(
    store,
    rank: int,
    lay: Layout,
    world: int,
    timeout_s: float,
    kind: str,
    min_link_gbps: float | None,
) -> list:
    """Rank 0 reads the first pass, posts the rest (`link_verdict.second_plan`: the slow links
    again, and beyond the full matrix the second pass); the others wait for it."""
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        while store.add("links/pass1/count", 0) < world and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        got = {
            r: json.loads(store.get(f"links/pass1/{r}"))
            for r in range(world)
            if store.check([f"links/pass1/{r}"])
        }
        missing = [r for r in range(world) if r not in got]
        if missing:
            store.set("links/plan2", json.dumps({"abort": missing}))
            raise LinkStageFailed(f"ranks {missing} sent no first-pass results")
        plan = link_verdict.second_plan(
            len(lay.hosts),
            _pair_links(lay, got)[0],
            sampled=kind == "sampled",
            min_link_gbps=min_link_gbps,
        )
        store.set("links/plan2", json.dumps({"rounds": plan}))
    else:
        try:
            store.wait(["links/plan2"], timedelta(seconds=timeout_s + 10))
        except RuntimeError:
            raise LinkStageFailed("rank 0 posted no second-pass plan") from None
    answer = json.loads(store.get("links/plan2"))
    if "abort" in answer:
        raise LinkStageFailed(f"ranks {answer['abort']} sent no first-pass results")
    return [[tuple(p) for p in rnd] for rnd in answer["rounds"]]


def _pair_links(lay: Layout, records: dict[int, list[dict]]) -> tuple[list[dict], list[dict]]:
    """Per-rank records -> links between nodes (a, b, rail, gbps both ways, latency) and
    intra-node links."""
    by_pair: dict[tuple[int, int, int], dict] = {}
    for rank, recs in records.items():
        for rec in recs:
            peer = rec["peer"]
            lo, hi = min(rank, peer), max(rank, peer)
            key = (lo, hi, rec["round"])
            entry = by_pair.setdefault(key, {"ranks": [lo, hi], "intra": rec["intra"], "dirs": {}})
            entry["dirs"]["ab" if rank == lo else "ba"] = rec
            if rank == lo:
                entry["latency_us"] = rec["latency_us"]
    cross, intra = [], []
    for (lo, hi, rnd), entry in sorted(by_pair.items()):
        dirs = entry["dirs"]
        a, b = lay.node_of(lo), lay.node_of(hi)
        link = {
            "a": a,
            "b": b,
            "rail": lay.ranks[a].index(lo),
            "ranks": [lo, hi],
            "round": rnd,
            "gbps": min(d["gbps_out"] for d in dirs.values()),
            "gbps_ab": dirs["ab"]["gbps_out"] if "ab" in dirs else None,
            "gbps_ba": dirs["ba"]["gbps_out"] if "ba" in dirs else None,
            "latency_us": entry.get("latency_us"),
        }
        for key in ("reps", "starved_reps", "extra_reps"):
            link[key] = sum(d.get(key, 0) for d in dirs.values())
        link["cpu_wait_known"] = any(d.get("cpu_wait_known") for d in dirs.values())
        # The link reads as its slower direction; that reading is in doubt only when it came
        # from a direction starved in every transfer (an unstarved one as slow settles it).
        trusted = [d["gbps_out"] for d in dirs.values() if not d.get("starved")]
        if not trusted or min(trusted) > link["gbps"]:
            link["starved"] = max(
                d["starved"]
                for d in dirs.values()
                if d.get("starved") and d["gbps_out"] == link["gbps"]
            )
        (intra if entry["intra"] else cross).append(link)
    return cross, intra


def collect(
    store,
    lay: Layout | None,
    *,
    world: int,
    identities: list[dict],
    timeout_s: float,
    started: float,
    min_link_gbps: float | None,
    judge_intra: bool,
    nbytes: int,
) -> dict:
    """Rank 0, after its own part: wait for every rank's status (at most the timeout plus a
    grace from the stage's start), then judge what was measured."""
    deadline = started + timeout_s + max(2.0, 0.25 * timeout_s)
    while store.add("links/status/count", 0) < world and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    statuses: dict[int, dict] = {}
    records: dict[int, list[dict]] = {}
    for r in range(world):
        if store.check([f"links/status/{r}"]):
            statuses[r] = json.loads(store.get(f"links/status/{r}"))
            records[r] = json.loads(store.get(f"links/res/{r}"))
    silent = [r for r in range(world) if r not in statuses]
    if lay is None:  # the layout exchange itself failed: hosts from the check-in
        hosts = []
        for ident in identities:
            if ident["host"] not in hosts:
                hosts.append(ident["host"])
        ranks = [[i["rank"] for i in identities if i["host"] == h] for h in hosts]
        lay = Layout(hosts=hosts, ranks=ranks, local=[i.get("local_rank") or 0 for i in identities])
    cross, intra = _pair_links(lay, records)
    failed = {r: s["why"] for r, s in statuses.items() if s["state"] != "done"}
    return link_verdict.assess(
        hosts=lay.hosts,
        ranks=lay.ranks,
        local=lay.local,
        cross=cross,
        intra=intra,
        silent=silent,
        failed=failed,
        min_link_gbps=min_link_gbps,
        judge_intra=judge_intra,
        timeout_s=timeout_s,
        nbytes=nbytes,
        elapsed_s=time.monotonic() - started,
    )


def stage_rails(device) -> int | None:
    """The local ranks measured between nodes: every rail on GPUs (NCCL gives each GPU its
    own NIC on a rail-optimised node), local rank 0 only on CPU: gloo sends every rank of a
    host through the same interface, so the other local ranks would measure that one NIC
    again, at once, each getting a share of it."""
    return None if device.type == "cuda" else 1


def stage_bytes(device) -> int:
    return int(
        os.environ.get("LOCKSTEP_LINK_BYTES", GPU_BYTES if device.type == "cuda" else CPU_BYTES)
    )


def _line(err: BaseException) -> str:
    from lockstep.redact import scrub_text

    return scrub_text((str(err).strip().splitlines() or [repr(err)])[0])[:300]
