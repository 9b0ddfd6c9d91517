"""The link stage's schedule, from plain data (no torch, no process group): which node pairs
each round measures.

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
again before the second pass, in rounds of disjoint pairs (the links whose ends have the fewest
other slow links first; of a node with most of its links slow, only its `NODE_CONFIRMS`
slowest): within the full matrix every one of them (`confirm_budget`), beyond it up to
`CONFIRM_ROUNDS` rounds. The verdict takes each pair's best measurement (`best_of`): contention
only slows a transfer, so one slowed transfer on a busy host is not a slow link, while a slow
link is slow every time. A link is named only when it was slow in both (`verdict.evidence`:
slow once, it is not judged). Nothing looked slow, no round added. In all `ceil(log2 N) + 7`
rounds at most beyond the full matrix, within the `2 log2(N) + 4` budget for every N > 32.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import numpy as np

from lockstep.preflight.links.stats import (
    Pair,
    best_of,
    by_rail,
    column,
    merge_rails,
    starved_doubt,
    summarize,
    take,
)

FULL_MATRIX = 32
SECOND_PASS = 3
CONFIRM_ROUNDS = 2
NODE_CONFIRMS = 2  # a node with most of its links in doubt: how many of them are measured again

Round = list[Pair]


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
    again = np.asarray(doubtful(n, links, min_link_gbps), dtype=bool)
    ends = np.union1d(column(links, "a")[again], column(links, "b")[again])
    return ends.tolist()


def doubtful(n: int, links: Sequence[dict], min_link_gbps: float | None) -> list[bool]:
    """Per link: below the threshold of the links judged (the starved readings that clear
    the bar with them, as the verdict judges: `stats.judgeable`), or starved and below the bar:
    the links worth measuring again. (The bar alone missed a slow node whose slow links were
    the only unstarved ones: they set it, and nothing was measured again.)"""
    doubt, _ = starved_doubt(n, links, min_link_gbps)
    judged = take(links, np.flatnonzero(~doubt))
    threshold = summarize(n, judged, min_link_gbps)["threshold"] if judged else math.nan
    return (doubt | (column(links, "gbps") < threshold)).tolist()  # NaN: nothing


def confirm_rounds(
    n: int,
    links: Sequence[dict],
    *,
    min_link_gbps: float | None = None,
    rounds: int = CONFIRM_ROUNDS,
    pairs_merged: bool = False,
) -> list[Round]:
    """Rounds that measure the slow links of the first pass again (judged rail by rail; the
    starved ones below the threshold too), at most `rounds` of disjoint pairs: the links whose
    ends have the fewest other slow links first. Those are the ones a single slowed transfer
    would make into a false slow link (among equals, the slowest first); a slow node's many slow
    links confirm one another, so of a node with more than half its links in doubt only its
    `NODE_CONFIRMS` slowest are taken (naming it takes one confirmed; a named node's links are
    never named as links). Empty when nothing looked slow. `pairs_merged`: `links` are
    `best_of`'s already."""
    merged = links if pairs_merged else best_of(links)
    rails = by_rail(merged)
    slowest: dict[Pair, float] = {}  # each pair in doubt: its slowest rail's reading
    for rail in sorted(rails):
        mine = rails[rail]
        for x, again in zip(mine, doubtful(n, mine, min_link_gbps), strict=True):
            if again:
                p = _pair(x)
                slowest[p] = min(slowest.get(p, math.inf), x["gbps"])
    measured = _degrees(n, {_pair(x) for x in merged})
    degree = _degrees(n, slowest)
    # a node with most of its links in doubt: only its `NODE_CONFIRMS` slowest are taken
    at: dict[int, list[Pair]] = {}
    for p in slowest:
        for end in p:
            if 2 * degree[end] > measured[end]:
                at.setdefault(end, []).append(p)
    allowed = {
        node: set(sorted(pairs, key=lambda p: (slowest[p], p))[:NODE_CONFIRMS])
        for node, pairs in at.items()
    }
    kept = [p for p in slowest if all(p in allowed.get(e, (p,)) for e in p)]
    kept.sort(key=lambda p: (degree[p[0]] + degree[p[1]], slowest[p], p))
    out: list[Round] = []
    while kept and len(out) < rounds:
        used: set[int] = set()
        this, rest = [], []
        for a, b in kept:
            if a in used or b in used:
                rest.append((a, b))
            else:
                used |= {a, b}
                this.append((a, b))
        out.append(this)
        kept = rest
    return out


def _pair(link: dict) -> Pair:
    return (min(link["a"], link["b"]), max(link["a"], link["b"]))


def _degrees(n: int, pairs: Iterable[Pair]) -> list[int]:
    """How many of `pairs` each node is an end of."""
    count = [0] * n
    for a, b in pairs:
        count[a] += 1
        count[b] += 1
    return count


def confirm_budget(n: int, *, sampled: bool) -> int:
    """The confirmation rounds at most. Within the full matrix, enough for every pair
    `confirm_rounds` keeps: a node keeps at most max(2, (N-1)/2) of them (more would make it a
    node mostly in doubt), and greedy disjoint rounds of pairs whose nodes keep at most D take at
    most 2D-1 <= N rounds. A noisy bed can put more links in doubt than two rounds hold, and a
    slow link left out stays unconfirmed, never named (the CI run of 0561f13 passed a link at a
    fifth of the rate that way). Beyond it, `CONFIRM_ROUNDS` (the sampled schedule's budget)."""
    return CONFIRM_ROUNDS if sampled else max(CONFIRM_ROUNDS, n)


def plan_rounds(n: int, *, sampled: bool) -> int:
    """The rounds a second plan (`second_plan`) can hold: what the broadcast is sized for."""
    return confirm_budget(n, sampled=sampled) + SECOND_PASS * sampled


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
    merged = best_of(links)  # once for both
    rounds = confirm_budget(n, sampled=sampled)
    plan = confirm_rounds(n, merged, min_link_gbps=min_link_gbps, rounds=rounds, pairs_merged=True)
    if sampled:
        plan += second_pass(n, suspects(n, merge_rails(merged), min_link_gbps), seed=seed)
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
