"""The link stage's schedule and verdict, from plain data: no torch, no process group (numpy).

Schedule. Up to `FULL_MATRIX` nodes every pair is measured: a round-robin (the circle method),
N-1 rounds of N/2 disjoint pairs (N rounds with a bye when N is odd). 32 is where that stops
being cheap: 31 rounds of about 0.2 s each (two large transfers per direction and a latency
ping-pong) is a few seconds, and the rounds grow linearly with N. Beyond it, a first pass of
`ceil(log2 N) + 2` rounds (two ring pairings, i with i+1, then random perfect matchings), then a
second pass of `SECOND_PASS` rounds that pairs each suspect (an end of a link that looked slow)
with nodes whose links all looked fine. A slow node is slow on every link, so it is a suspect
after the first pass whoever its partners were, and the second pass gives it good partners
only; its first-pass partners have one slow link among `log2 N + 2` and stay fine. A slow link
between one pair is measured only if the pair is drawn: certain within the full matrix, a
probability beyond it (about rounds/N per link; benchmarks/bench_links.py reports it).

Confirmation. Whatever the size, the links that looked slow in the first pass are measured
again, up to `CONFIRM_ROUNDS` rounds of disjoint pairs (the links whose ends have the fewest
other slow links first), before the second pass; the verdict takes each pair's best
measurement (`best_of`): contention only slows a transfer, so one slowed transfer on a busy
host is not a slow link, while a slow link is slow every time. Nothing looked slow, no round
added. In all `ceil(log2 N) + 7` rounds at most beyond the full matrix, within the
`2 log2(N) + 4` budget for every N > 32.

Verdict (robust statistics, no fixed Gb/s). The typical bandwidth is the median of the nodes'
median links (a slow node moves its own median, not the others'); the spread is 1.4826 times
the MAD of the links within MIN_DROP of it (a slow node's links do not inflate it). A
link is slow below typical - max(K_MAD x spread, MIN_DROP x typical) (that drop capped at
MAX_DROP x typical: a link at under 40% of typical is slow however noisy the rest), or below
`--min-link-gbps`. Then, repeatedly, the node with the largest share of slow links among links
to nodes not yet named, when that share is over half (and it has at least two such links), is a
**slow node**; the slow links left, between nodes that are fine elsewhere, are **slow links**.
The exclude list takes every slow node, for a slow link the end whose other links are slower
(both when the difference is within the spread), and every node that never joined.

CPU starvation. A rank that waits for a CPU moves data at the CPU's pace, not the link's, so
each transfer carries its ends' run-queue wait (links.py); a measurement where the two ends
together waited more than `STARVED_FRACTION` of the transfer is starved. A link is `starved`
when every measurement of it was (its best reading then says only that the link is at least
that fast). A starved link at or above the threshold of the unstarved links (of the starved
readings themselves where every link of a rail was starved) is a lower bound above it and is
judged with them; one below it is reported as not judged (`not_judged`, a warning), never as a
slow link or node, and does not fail the run. The confirmation rounds measure those again too.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence

import numpy as np

FULL_MATRIX = 32
SECOND_PASS = 3
CONFIRM_ROUNDS = 2
K_MAD = 4.0
MIN_DROP = 0.25
MAX_DROP = 0.6
# A transfer is CPU-starved when its two ends together waited more than this fraction of it
# for a CPU. Starvation slows a transfer by at most the time waited, so one whose ends waited at
# most MIN_DROP of it ran at (1 - MIN_DROP) or more of its unstarved speed: a link at the typical
# speed cannot be pushed under the slow threshold (typical less at least MIN_DROP of it) by such
# waits. Above it the reading may be the CPU's pace, not the link's.
STARVED_FRACTION = MIN_DROP

Pair = tuple[int, int]
Round = list[Pair]


# ---------------------------------------------------------------------- schedule


def round_robin(n: int) -> list[Round]:
    """Every pair once: N-1 rounds of N/2 disjoint pairs (N rounds, one idle node each, when
    N is odd). The circle method: node 0 fixed, the others rotate."""
    if n < 2:
        return []
    ids = list(range(n)) + ([-1] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ids[i], ids[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a >= 0 and b >= 0])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def first_pass_rounds(n: int) -> int:
    return math.ceil(math.log2(n)) + 2 if n > 1 else 0


def budget(n: int) -> int:
    """Rounds the schedule may take beyond the full matrix: 2 log2(N) + 4."""
    return int(2 * math.log2(n) + 4) if n > 1 else 0


def first_pass(n: int, seed: int = 0, rounds: int | None = None) -> list[Round]:
    """Beyond `FULL_MATRIX`: two ring pairings, then random perfect matchings (seeded: every
    rank computes the same schedule)."""
    count = first_pass_rounds(n) if rounds is None else rounds
    rng = random.Random(seed)
    out: list[Round] = []
    for k in range(count):
        if k < 2:  # ring: (0,1),(2,3),... then (1,2),(3,4),...,(n-1,0)
            pairs = [(i, (i + 1) % n) for i in range(k, n - (1 if n % 2 else 0) + k - 1, 2)]
            pairs = [p for p in pairs if p[0] != p[1]][: n // 2]
        else:
            order = list(range(n))
            rng.shuffle(order)
            pairs = [(order[i], order[i + 1]) for i in range(0, n - 1, 2)]
        out.append(_disjoint([(min(a, b), max(a, b)) for a, b in pairs]))
    return out


def _disjoint(pairs: Iterable[Pair]) -> Round:
    seen: set[int] = set()
    out = []
    for a, b in pairs:
        if a in seen or b in seen or a == b:
            continue
        seen |= {a, b}
        out.append((a, b))
    return out


def schedule(n: int, full_matrix: int = FULL_MATRIX, seed: int = 0) -> tuple[str, list[Round]]:
    """('full', every round) up to `full_matrix` nodes, else ('sampled', the first pass; the
    second comes from `second_pass` once the first one's results are in)."""
    if n <= full_matrix:
        return "full", round_robin(n)
    return "sampled", first_pass(n, seed)


def suspects(n: int, links: Sequence[dict], min_link_gbps: float | None = None) -> list[int]:
    """Nodes with at least one slow link so far (or a starved one below the threshold): both
    ends of each."""
    again = _doubtful(n, links, min_link_gbps)
    return sorted({e for x, bad in zip(links, again, strict=True) if bad for e in (x["a"], x["b"])})


def _doubtful(n: int, links: Sequence[dict], min_link_gbps: float | None) -> list[bool]:
    """Per link: slow, or starved and below the threshold (`_starved_bar`): the links worth
    measuring again."""
    threshold = _starved_bar(n, links, min_link_gbps)["threshold"]
    return [bool(x["gbps"] < threshold) for x in links]  # NaN threshold: nothing


def _starved_bar(n: int, links: Sequence[dict], min_link_gbps: float | None) -> dict:
    """The statistics a starved link is held against: those of the links not starved; where
    every link was, those of the starved readings themselves (each a lower bound on its link),
    so that a uniformly starved set holds no outlier, and one far below the rest stays in
    doubt."""
    judged = [x for x in links if not x.get("starved")]
    return _stats(n, judged or links, min_link_gbps)


def best_of(links: Sequence[dict]) -> list[dict]:
    """Repeated measurements of one node pair on one rail (a confirmation round, or a pairing
    drawn twice) as one link, the fastest, with `measurements` (how many). Contention for a
    shared CPU, bus or switch only ever slows a transfer, so the best of several is the link's
    speed (as nccl-tests and iperf report the best); a link that is slow stays slow every time
    it is measured. `starved` stays only when every measurement was starved (the least starved
    fraction): one measurement with both ends on a CPU is the link's own speed. Order: each pair
    where it first appears."""
    best: dict[tuple[int, int, int], dict] = {}
    for x in links:
        key = (min(x["a"], x["b"]), max(x["a"], x["b"]), x.get("rail", 0))
        cur = best.get(key)
        if cur is None:
            best[key] = {**x, "measurements": 1}
            continue
        starved = _starved_both(cur.get("starved"), x.get("starved"))
        merged = {**x} if x["gbps"] > cur["gbps"] else cur
        merged["measurements"] = cur["measurements"] + 1
        merged.pop("starved", None)
        if starved is not None:
            merged["starved"] = starved
        best[key] = merged
    return list(best.values())


def _starved_both(a: float | None, b: float | None) -> float | None:
    """Two measurements' starvation: starved only when both were (the lesser fraction)."""
    return None if not a or not b else min(a, b)


def confirm_rounds(
    n: int,
    links: Sequence[dict],
    *,
    min_link_gbps: float | None = None,
    rounds: int = CONFIRM_ROUNDS,
) -> list[Round]:
    """Rounds that measure the slow links of the first pass again (judged rail by rail; the
    starved ones below the threshold too), at most `rounds` of disjoint pairs: the links whose
    ends have the fewest other slow links first. Those are the ones a single slowed transfer
    would make into a false slow link; a slow node's many slow links confirm one another. Empty
    when nothing looked slow."""
    merged = best_of(links)
    pairs: set[Pair] = set()
    for rail in sorted({x.get("rail", 0) for x in merged}):
        mine = [x for x in merged if x.get("rail", 0) == rail]
        for x, again in zip(mine, _doubtful(n, mine, min_link_gbps), strict=True):
            if again:
                pairs.add((min(x["a"], x["b"]), max(x["a"], x["b"])))
    degree = [0] * n
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    left = sorted(pairs, key=lambda p: (degree[p[0]] + degree[p[1]], p))
    out: list[Round] = []
    while left and len(out) < rounds:
        used: set[int] = set()
        this, rest = [], []
        for a, b in left:
            if a in used or b in used:
                rest.append((a, b))
            else:
                used |= {a, b}
                this.append((a, b))
        out.append(this)
        left = rest
    return out


def second_plan(
    n: int,
    links: Sequence[dict],
    *,
    sampled: bool,
    seed: int = 1,
    min_link_gbps: float | None = None,
) -> list[Round]:
    """What rank 0 posts once the first pass is in: the confirmation rounds, then, beyond the
    full matrix, the second pass (each suspect with known-good nodes)."""
    plan = confirm_rounds(n, links, min_link_gbps=min_link_gbps)
    if sampled:
        merged = merge_rails(best_of(links))
        plan += second_pass(n, suspects(n, merged, min_link_gbps), seed=seed)
    return plan


def second_pass(
    n: int, suspect: Sequence[int], dropped: Iterable[int] = (), seed: int = 1, rounds: int = 0
) -> list[Round]:
    """Each suspect paired with a different known-good node in each round (good: no slow link
    in the first pass); the good nodes left over are paired at random among themselves, so
    the rounds also sample more links."""
    rounds = rounds or SECOND_PASS
    rng = random.Random(seed)
    gone = set(dropped)
    bad = [s for s in suspect if s not in gone]
    good = [k for k in range(n) if k not in set(bad) and k not in gone]
    out: list[Round] = []
    for _ in range(rounds):
        rng.shuffle(good)
        pairs = list(zip(bad, good, strict=False))
        rest = good[len(pairs) :]
        pairs += [(rest[i], rest[i + 1]) for i in range(0, len(rest) - 1, 2)]
        out.append(_disjoint((min(a, b), max(a, b)) for a, b in pairs))
    return out


# ---------------------------------------------------------------------- verdict


def _arrays(links: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = len(links)
    a = np.fromiter((x["a"] for x in links), dtype=np.int64, count=count)
    b = np.fromiter((x["b"] for x in links), dtype=np.int64, count=count)
    g = np.fromiter((x["gbps"] for x in links), dtype=np.float64, count=count)
    return a, b, g


class _ByNode:
    """Each node's links, grouped (CSR): `vals[start[k]:start[k] + count[k]]` are node k's link
    bandwidths in ascending order, `ids` the same slice's link indices."""

    def __init__(self, n: int, a: np.ndarray, b: np.ndarray, g: np.ndarray):
        ends = np.concatenate([a, b])
        vals = np.concatenate([g, g])
        order = np.lexsort((vals, ends))
        self.vals = vals[order]
        self.ids = np.concatenate([np.arange(len(g)), np.arange(len(g))])[order]
        self.count = np.bincount(ends, minlength=n)
        self.start = np.cumsum(self.count) - self.count

    def of(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        s, c = self.start[node], self.count[node]
        return self.vals[s : s + c], self.ids[s : s + c]

    def medians(self, high: bool) -> np.ndarray:
        """Per node: the median of its links (`high`: the upper middle value for an even count,
        so that with two links, one slow, a node is typical by its other link); NaN for none."""
        out = np.full(len(self.count), np.nan)
        has = self.count > 0
        s, c = self.start[has], self.count[has]
        upper = self.vals[s + c // 2]
        out[has] = upper if high else (self.vals[s + (c - 1) // 2] + upper) / 2
        return out


def _stats(n: int, links: Sequence[dict], min_link_gbps: float | None) -> dict:
    a, b, g = _arrays(links)
    by = _ByNode(n, a, b, g)
    node_median = by.medians(high=True)
    measured = node_median[~np.isnan(node_median)]
    typical = float(np.median(measured)) if len(measured) else math.nan
    near = g[np.abs(g - typical) <= MIN_DROP * typical] if len(measured) else g[:0]
    spread = 1.4826 * float(np.median(np.abs(near - typical))) if len(near) else 0.0
    drop = min(MAX_DROP * typical, max(K_MAD * spread, MIN_DROP * typical))
    threshold = typical - drop if len(measured) else math.nan
    if min_link_gbps is not None:
        threshold = min_link_gbps if math.isnan(threshold) else max(threshold, min_link_gbps)
    slow = g < threshold  # NaN threshold: nothing slow
    return {
        "a": a,
        "b": b,
        "g": g,
        "by_node": by,
        "node_median": node_median,
        "typical": typical,
        "spread": spread,
        "threshold": threshold,
        "slow": slow,
    }


def judge(
    n: int,
    links: Sequence[dict],
    *,
    min_link_gbps: float | None = None,
    dropped: Iterable[int] = (),
) -> dict:
    """The verdict on links between `n` nodes. `links`: dicts with `a`, `b` (node indices) and
    `gbps` (one per measurement; more keys are kept). Returns node indices:
    {"typical_gbps", "spread_gbps", "threshold_gbps", "slow_nodes": [{node, median_gbps,
    slow, links}], "slow_links": [{a, b, gbps, exclude: [...]}, ...], "dropped", "exclude",
    "node_median_gbps"}. numpy throughout: 35,000 links between 4,096 nodes in well under a
    second (benchmarks/bench_links.py)."""
    st = _stats(n, links, min_link_gbps)
    a, b, slow, by = st["a"], st["b"], st["slow"], st["by_node"]
    gone = sorted(set(dropped))
    # Per node: its links to nodes not yet named, and how many of those are slow. Naming a
    # node takes its links out of its neighbours' counts (only its own links change).
    total = by.count.astype(np.float64)
    both = np.concatenate([slow, slow]).astype(np.float64)
    slow_at = np.bincount(np.concatenate([a, b]), weights=both, minlength=n)
    slow_count = slow_at.copy()
    open_ = np.ones(n, dtype=bool)
    open_[[k for k in gone if 0 <= k < n]] = False
    named: list[int] = []
    while True:
        eligible = open_ & (total >= 2)
        share = np.where(eligible, slow_at / np.maximum(total, 1), 0.0)
        best = int(np.argmax(share)) if n else 0
        if not n or share[best] <= 0.5:
            break
        named.append(best)
        open_[best] = False
        _, ids = by.of(best)
        others = np.where(a[ids] == best, b[ids], a[ids])
        np.subtract.at(total, others, 1)
        np.subtract.at(slow_at, others, slow[ids])
    is_named = np.zeros(n, dtype=bool)
    is_named[named] = True
    medians = by.medians(high=False)
    slow_nodes = [
        {
            "node": node,
            "median_gbps": float(medians[node]),
            "slow": int(slow_count[node]),
            "links": int(by.count[node]),
        }
        for node in named
    ]
    slow_links = []
    typical, spread = st["typical"], st["spread"]
    margin = max(2 * spread, 0.05 * typical) if not math.isnan(typical) else 0.0
    for i in np.flatnonzero(slow & ~is_named[a] & ~is_named[b]):
        ends = (int(a[i]), int(b[i]))
        oa, ob = (_median_without(by, end, i) for end in ends)
        if math.isnan(oa) or math.isnan(ob) or abs(oa - ob) <= margin:
            exclude = list(ends)
        else:
            exclude = [ends[0]] if oa < ob else [ends[1]]
        slow_links.append({**links[i], "others_gbps": [oa, ob], "exclude": exclude})
    exclude = sorted(set(named) | {e for x in slow_links for e in x["exclude"]} | set(gone))
    return {
        "typical_gbps": typical,
        "spread_gbps": spread,
        "threshold_gbps": st["threshold"],
        "node_median_gbps": [float(v) for v in st["node_median"]],
        "slow_nodes": slow_nodes,
        "slow_links": slow_links,
        "dropped": gone,
        "exclude": exclude,
    }


def _median_without(by: _ByNode, node: int, link: int) -> float:
    """The median of `node`'s links other than `link`: its other links' typical bandwidth."""
    vals, ids = by.of(node)
    rest = vals[ids != link]
    return float(np.median(rest)) if len(rest) else math.nan


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def matrix(n: int, links: Sequence[dict]) -> list[list[float | None]]:
    """N x N Gb/s (the slowest measurement of each pair), None where not measured."""
    out: list[list[float | None]] = [[None] * n for _ in range(n)]
    for x in links:
        a, b = x["a"], x["b"]
        cur = out[a][b]
        v = x["gbps"] if cur is None else min(cur, x["gbps"])
        out[a][b] = out[b][a] = v
    return out


def merge_rails(links: Sequence[dict]) -> list[dict]:
    """One entry per node pair: the slowest rail (one slow rail is a slow NIC on that pair)."""
    best: dict[Pair, dict] = {}
    for x in links:
        key = (min(x["a"], x["b"]), max(x["a"], x["b"]))
        if key not in best or x["gbps"] < best[key]["gbps"]:
            best[key] = x
    return [best[k] for k in sorted(best)]


# ---------------------------------------------------------------------- the report section

MATRIX_MAX = 256  # the JSON carries the N x N matrix up to this many nodes (the links always)


def assess(
    *,
    hosts: Sequence[str],
    ranks: Sequence[Sequence[int]],
    local: Sequence[int | None],
    cross: Sequence[dict],
    intra: Sequence[dict] = (),
    silent: Sequence[int] = (),
    failed: dict[int, str] | None = None,
    min_link_gbps: float | None = None,
    judge_intra: bool = False,
    timeout_s: float | None = None,
    nbytes: int | None = None,
    elapsed_s: float | None = None,
) -> dict:
    """The report's `links` section: each rail judged on its own (local rank i of every node),
    findings named by host, local rank and rank; `problems` (one line each), `kind` (the first
    finding: dropped, slow_node, slow_link, or None) and `exit_code` (3 when a node dropped out
    or a transfer failed, 1 for a slow node or link, else 0). Links `starved` of CPU in every
    measurement are judged by none of that: below the threshold they are `not_judged`, with a
    line each in `warnings`, and change neither `kind` nor `exit_code`."""
    from lockstep.env.hostlist import compress

    failed = failed or {}
    n = len(hosts)
    rounds_run = len({x["round"] for x in [*cross, *intra]})
    cpu_wait = _cpu_wait([*cross, *intra])
    cross = best_of(cross)  # a pair measured again (confirmation): its best
    node_of = {r: k for k, rs in enumerate(ranks) for r in rs}
    silent_nodes = sorted({node_of[r] for r in silent if r in node_of})
    problems: list[str] = []
    kinds: list[str] = []

    def who(node: int, rail: int | None = None) -> str:
        if rail is None:
            return f"{hosts[node]} (rank {_ranges(ranks[node])})"
        rank = ranks[node][rail]
        return f"{hosts[node]} local rank {_show(local[rank])} (rank {rank})"

    for node in silent_nodes:
        gone = [r for r in silent if node_of.get(r) == node]
        problems.append(
            f"node {hosts[node]} (rank {_ranges(gone)}) dropped out during the link stage: "
            f"no answer within {_g(timeout_s)} s"
        )
        kinds.append("dropped")
    if failed and not silent_nodes:
        first = min(failed)
        problems.append(
            f"the link stage failed on rank {_ranges(list(failed))}: rank {first}: {failed[first]}"
        )
        kinds.append("link_error")

    rails = max((len(rs) for rs in ranks), default=0)
    per_rail = []
    slow_nodes, slow_links, not_judged = [], [], []
    warnings: list[str] = []
    exclude: set[int] = set(silent_nodes)
    for rail in range(rails):
        mine = [x for x in cross if x["rail"] == rail]
        if not mine:
            continue
        # A starved reading is a lower bound on its link: one at or above the bar of the
        # unstarved readings is judged with them (left out, a loaded machine's starved fast
        # links would leave a slow node's links to set the typical, and nothing is named).
        bar = _starved_bar(n, mine, min_link_gbps)
        judged, unjudged = [], []
        for x in mine:
            (unjudged if x.get("starved") and x["gbps"] < bar["threshold"] else judged).append(x)
        v = judge(n, judged, min_link_gbps=min_link_gbps, dropped=silent_nodes)
        per_rail.append(
            {
                "rail": rail,
                "typical_gbps": _r(v["typical_gbps"]),
                "spread_gbps": _r(v["spread_gbps"]),
                "threshold_gbps": _r(v["threshold_gbps"]),
                "links": len(mine),
                "starved": len(unjudged),
            }
        )
        for x in unjudged:
            a, b = x["a"], x["b"]
            not_judged.append(
                {
                    "hosts": [hosts[a], hosts[b]],
                    "nodes": [a, b],
                    "rail": rail,
                    "ranks": x["ranks"],
                    "local_ranks": [local[r] for r in x["ranks"]],
                    "gbps": _r(x["gbps"]),
                    "typical_gbps": _r(bar["typical"]),
                    "starved": _r(x["starved"]),
                }
            )
            warnings.append(
                f"link {who(a, rail)} <-> {who(b, rail)} not judged: CPU-starved, its ends "
                f"waited for a CPU {x['starved']:.0%} of the transfer in every measurement "
                f"({_r(x['gbps'])} Gb/s measured, typical {_r(bar['typical'])} Gb/s)"
            )
        for s in v["slow_nodes"]:
            node = s["node"]
            slow_nodes.append(
                {
                    "host": hosts[node],
                    "node": node,
                    "rail": rail,
                    "local_rank": local[ranks[node][rail]],
                    "rank": ranks[node][rail],
                    "median_gbps": _r(s["median_gbps"]),
                    "typical_gbps": _r(v["typical_gbps"]),
                    "slow_links": s["slow"],
                    "links": s["links"],
                }
            )
            problems.append(
                f"slow node {who(node, rail)}: median link {_r(s['median_gbps'])} Gb/s vs "
                f"typical {_r(v['typical_gbps'])} Gb/s ({s['slow']} of {s['links']} links slow)"
            )
            kinds.append("slow_node")
        for s in v["slow_links"]:
            a, b = s["a"], s["b"]
            slow_links.append(
                {
                    "hosts": [hosts[a], hosts[b]],
                    "nodes": [a, b],
                    "rail": rail,
                    "ranks": s["ranks"],
                    "local_ranks": [local[r] for r in s["ranks"]],
                    "gbps": _r(s["gbps"]),
                    "typical_gbps": _r(v["typical_gbps"]),
                    "others_gbps": [_r(x) for x in s["others_gbps"]],
                    "exclude": [hosts[e] for e in s["exclude"]],
                }
            )
            problems.append(
                f"slow link {who(a, rail)} <-> {who(b, rail)}: {_r(s['gbps'])} Gb/s vs typical "
                f"{_r(v['typical_gbps'])} Gb/s; their other links {_r(s['others_gbps'][0])} and "
                f"{_r(s['others_gbps'][1])} Gb/s; exclude {', '.join(hosts[e] for e in s['exclude'])}"
            )
            kinds.append("slow_link")
        exclude |= set(v["exclude"])

    intra_nodes = []
    if judge_intra:
        intra_nodes, starved_intra = _judge_intra(n, intra, min_link_gbps)
        for s in starved_intra:
            node = s["node"]
            not_judged.append({**s, "host": hosts[node], "intra": True})
            warnings.append(
                f"node {who(node)} within the node not judged: CPU-starved, its ranks waited "
                f"for a CPU {s['starved']:.0%} of the transfer in every measurement "
                f"({s['gbps']} Gb/s measured, typical {s['typical_gbps']} Gb/s)"
            )
    for s in intra_nodes:
        node = s["node"]
        slow_nodes.append({**s, "host": hosts[node], "intra": True})
        problems.append(
            f"slow node {who(node)} within the node: {s['gbps']} Gb/s between its ranks vs "
            f"typical {s['typical_gbps']} Gb/s"
        )
        kinds.append("slow_node")
        exclude.add(node)

    names = [hosts[k] for k in sorted(exclude)]
    node_level = merge_rails(cross)
    out = {
        "schedule": ("full" if n <= FULL_MATRIX else "sampled"),
        "nodes": [
            {
                "node": k,
                "host": h,
                "ranks": list(ranks[k]),
                "local_ranks": [local[r] for r in ranks[k]],
            }
            for k, h in enumerate(hosts)
        ],
        "rounds": rounds_run,
        "bytes": nbytes,
        "min_link_gbps": min_link_gbps,
        "rails": per_rail,
        "typical_gbps": _r(_median([r["typical_gbps"] for r in per_rail])) if per_rail else None,
        "links": [_clean(x) for x in cross],
        "intra": [_clean(x) for x in intra],
        "slow_nodes": slow_nodes,
        "slow_links": slow_links,
        "not_judged": not_judged,
        "cpu_wait": cpu_wait,
        "warnings": warnings,
        "dropped": [hosts[k] for k in silent_nodes],
        "silent_ranks": sorted(silent),
        "failed_ranks": {str(r): why for r, why in sorted(failed.items())},
        "exclude": names,
        "exclude_hostlist": compress(names) if names else "",
        "problems": problems,
        "kind": kinds[0] if kinds else None,
        "kinds": list(dict.fromkeys(kinds)),
        "exit_code": 3 if (silent_nodes or failed) else (1 if problems else 0),
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
    }
    if n <= MATRIX_MAX:
        out["matrix_gbps"] = [[_r(v) for v in row] for row in matrix(n, node_level)]
    return out


def _judge_intra(
    n: int, intra: Sequence[dict], min_link_gbps: float | None
) -> tuple[list[dict], list[dict]]:
    """Within-node bandwidth (GPUs: NVLink or PCIe), each node's slowest pair against the
    median node; judged only with three nodes or more (or against --min-link-gbps). Returns
    (slow nodes, nodes whose slowest pair was CPU-starved and below the threshold: not
    judged); a starved pair counts only where it clears the unstarved pairs' threshold (a
    lower bound above it), as between nodes."""
    worst: dict[int, float] = {}
    starved: dict[int, tuple[float, float]] = {}  # node -> (its slowest starved pair, fraction)
    for x in best_of(intra):
        if x.get("starved"):
            if x["gbps"] < starved.get(x["a"], (math.inf, 0.0))[0]:
                starved[x["a"]] = (x["gbps"], x["starved"])
        else:
            worst[x["a"]] = min(worst.get(x["a"], math.inf), x["gbps"])

    def bar(values: list[float]) -> tuple[float, float]:
        typical = _median(values)
        spread = 1.4826 * _median([abs(v - typical) for v in values]) if values else 0.0
        drop = min(MAX_DROP * typical, max(K_MAD * spread, MIN_DROP * typical))
        threshold = typical - drop if len(values) >= 3 else -1.0
        if min_link_gbps is not None:
            threshold = max(threshold, min_link_gbps)
        return typical, threshold

    typical, threshold = bar(list(worst.values()))
    for k, (g, _) in list(starved.items()):
        if g >= threshold:  # a lower bound above the bar: judged with the rest
            worst[k] = min(worst.get(k, math.inf), g)
            del starved[k]
    typical, threshold = bar(list(worst.values()))
    slow = [
        {"node": k, "gbps": _r(v), "typical_gbps": _r(typical)}
        for k, v in sorted(worst.items())
        if v < threshold
    ]
    named = {s["node"] for s in slow}
    unjudged = [
        {"node": k, "gbps": _r(g), "typical_gbps": _r(typical), "starved": _r(f)}
        for k, (g, f) in sorted(starved.items())
        if g < threshold and k not in named
    ]
    return slow, unjudged


def _cpu_wait(measured: Sequence[dict]) -> dict:
    """The stage's transfers and how many were CPU-starved (`STARVED_FRACTION`) and measured
    again, over every measurement (both directions of each); `known`: whether any rank could
    read its run-queue wait."""
    out = {"threshold": STARVED_FRACTION, "reps": 0, "starved_reps": 0, "extra_reps": 0}
    for x in measured:
        for key in ("reps", "starved_reps", "extra_reps"):
            out[key] += x.get(key, 0)
    out["starved_links"] = sum(1 for x in best_of(measured) if x.get("starved"))
    out["known"] = any(x.get("cpu_wait_known") for x in measured)
    return out


def _clean(x: dict) -> dict:
    return {k: (_r(v) if isinstance(v, float) else v) for k, v in x.items()}


def _r(v: float | None) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(v, 4)


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def _show(v: object) -> str:
    return "-" if v is None else str(v)


def _ranges(ranks: Sequence[int]) -> str:
    parts: list[list[int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
