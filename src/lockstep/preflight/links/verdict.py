"""The link stage's verdict, from plain data (no torch, no process group; numpy): the slow
nodes and links among one rail's readings (`judge`), and within nodes (`judge_intra`); the
report's section is `section.assess`.

A link is slow below the threshold of the readings (`stats`: typical less a robust drop), or
below `--min-link-gbps`. Then, repeatedly, the node with the largest share of slow links among links
to nodes not yet named, when that share is over half (and it has at least two such links), is a
**slow node**; the slow links left, between nodes that are fine elsewhere, are **slow links**.
The exclude list takes every slow node, for a slow link the end whose other links are slower
(both when the difference is within the spread), and every node that never joined.

A link `starved` of CPU in every measurement is judged only where its reading clears the
threshold of the others (a lower bound above it); below it, `section.assess` reports it as not
judged (a warning), never a slow link or node, and it does not fail the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from lockstep.preflight.links.stats import (
    K_MAD,
    MAX_DROP,
    MIN_DROP,
    ByNode,
    best_of,
    median,
    rounded,
    summarize,
)


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
    st = summarize(n, links, min_link_gbps)
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


def _median_without(by: ByNode, node: int, link: int) -> float:
    """The median of `node`'s links other than `link`: its other links' typical bandwidth."""
    vals, ids = by.of(node)
    rest = vals[ids != link]
    return float(np.median(rest)) if len(rest) else math.nan


def judge_intra(
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
        typical = median(values)
        spread = 1.4826 * median([abs(v - typical) for v in values]) if values else 0.0
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
        {"node": k, "gbps": rounded(v), "typical_gbps": rounded(typical)}
        for k, v in sorted(worst.items())
        if v < threshold
    ]
    named = {s["node"] for s in slow}
    unjudged = [
        {"node": k, "gbps": rounded(g), "typical_gbps": rounded(typical), "starved": rounded(f)}
        for k, (g, f) in sorted(starved.items())
        if g < threshold and k not in named
    ]
    return slow, unjudged
