"""The link stage's verdict, from plain data (no torch, no process group; numpy): the slow
nodes and links among one rail's readings (`judge`), and within nodes (`judge_intra`); the
report's section is `section.assess`.

A link reads slow below the threshold of the readings (`stats`: typical less a robust drop), or
below `--min-link-gbps`. A reading is evidence only when it is clear of the threshold and
steady (`evidence`): at least `MIN_MARGIN` x typical below it, and its repeats (transfers and
measurements) spread less than that distance; one that is neither is not judged (borderline or
noisy), never slow. Then, repeatedly, the node with the largest share of such links among links
to nodes not yet named, when that share is over half, with at least two of them (two partners:
two independent measurements; a single slow link never makes its end a slow node) and one
measured again and slow again, is a **slow node**. The links left, between nodes that are fine
elsewhere, are **slow links** only when slow in a second measurement too (the confirmation
rounds); slow once, they are not judged (unconfirmed). Each named node and link carries its
margin below the threshold and its spread (`margin_gbps`, `noise_gbps`) in the report.
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
    MIN_MARGIN,
    ByNode,
    best_of,
    column,
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
    pairs_merged: bool = False,
) -> dict:
    """The verdict on links between `n` nodes. `links`: dicts with `a`, `b` (node indices) and
    `gbps` (one per measurement, merged here by `best_of`, unless `pairs_merged`: already
    one per pair, as `best_of` returns them; more keys are kept). Returns node
    indices: {"typical_gbps", "spread_gbps", "threshold_gbps", "min_margin_gbps",
    "slow_nodes": [{node, median_gbps, slow, confirmed, links, margin_gbps}], "slow_links":
    [{a, b, gbps, margin_gbps, noise_gbps, exclude: [...]}, ...], "not_judged": [{a, b, gbps,
    why, ...}], "dropped", "exclude", "node_median_gbps"}. numpy throughout: 35,000 links
    between 4,096 nodes in well under a second (benchmarks/bench_links.py)."""
    merged = links if pairs_merged else best_of(links)
    st = summarize(n, merged, min_link_gbps)
    a, b, by = st["a"], st["b"], st["by_node"]
    ev = evidence(merged, st, min_link_gbps)
    gone = sorted(set(dropped))
    named, slow_count, conf_count = _name_nodes(n, st, ev, gone)
    is_named = np.zeros(n, dtype=bool)
    is_named[named] = True
    medians = by.medians(high=False)
    threshold = st["threshold"]
    slow_nodes = [
        {
            "node": node,
            "median_gbps": float(medians[node]),
            "slow": int(slow_count[node]),
            "confirmed": int(conf_count[node]),
            "links": int(by.count[node]),
            "margin_gbps": float(threshold - medians[node]),
        }
        for node in named
    ]
    typical, spread = st["typical"], st["spread"]
    margin = max(2 * spread, 0.05 * typical) if not math.isnan(typical) else 0.0
    free = ~is_named[a] & ~is_named[b]
    slow_links = []
    for i in np.flatnonzero(ev["candidate"] & ev["confirmed"] & free):
        ends = (int(a[i]), int(b[i]))
        oa, ob = (_median_without(by, end, i) for end in ends)
        if math.isnan(oa) or math.isnan(ob) or abs(oa - ob) <= margin:
            exclude = list(ends)
        else:
            exclude = [ends[0]] if oa < ob else [ends[1]]
        slow_links.append(
            {**merged[i], **_margins(ev, i), "others_gbps": [oa, ob], "exclude": exclude}
        )
    doubt = st["slow"] & ~(ev["candidate"] & ev["confirmed"]) & free
    not_judged = [
        {**merged[i], **_margins(ev, i), "why": ev["why"][i]} for i in np.flatnonzero(doubt)
    ]
    exclude = sorted(set(named) | {e for x in slow_links for e in x["exclude"]} | set(gone))
    return {
        "typical_gbps": typical,
        "spread_gbps": spread,
        "threshold_gbps": threshold,
        "min_margin_gbps": ev["need"],
        "node_median_gbps": [float(v) for v in st["node_median"]],
        "slow_nodes": slow_nodes,
        "slow_links": slow_links,
        "not_judged": not_judged,
        "dropped": gone,
        "exclude": exclude,
    }


def evidence(links: Sequence[dict], st: dict, min_link_gbps: float | None) -> dict:
    """Per merged link (`best_of`), what its readings show against the threshold (`st`:
    `summarize`). A `candidate`: its best reading at least `MIN_MARGIN` x typical below the
    threshold and its repeats spread (best less worst reading, `noise`) less than that
    distance (`gap`), or below `--min-link-gbps`; `confirmed`: a candidate measured at least
    twice (every measurement slow: the best one is). Below the threshold otherwise, `why` it is
    not judged: borderline (within the margin), noisy (repeats spread wider than the gap), or
    unconfirmed (slow in one measurement only)."""
    g, bar, typical = st["g"], st["bar"], st["typical"]
    worst, times = column(links, "gbps_worst"), column(links, "measurements")
    need = MIN_MARGIN * typical if not math.isnan(typical) else 0.0
    gap = bar - g  # NaN bar: every comparison False
    noise = g - worst
    clear = (gap >= need) & (gap > 0)
    steady = noise <= gap
    candidate = clear & steady
    if min_link_gbps is not None:
        candidate |= g < min_link_gbps
    confirmed = candidate & (times >= 2)
    why = np.where(candidate, "unconfirmed", np.where(clear, "noisy", "borderline")).tolist()
    return {
        "candidate": candidate,
        "confirmed": confirmed,
        "gap": st["threshold"] - g,
        "noise": noise,
        "why": why,
        "need": need,
    }


def _margins(ev: dict, i: int) -> dict:
    """How far link `i` read below the threshold (`margin_gbps`) and how far its repeats
    spread (`noise_gbps`): what naming it, or not judging it, rests on."""
    return {"margin_gbps": float(ev["gap"][i]), "noise_gbps": float(ev["noise"][i])}


def _name_nodes(n: int, st: dict, ev: dict, gone: list[int]):
    """Repeatedly, the node with the largest share of candidate slow links among its links to
    nodes not yet named, when that share is over half, with at least two such links (a single
    slow link never makes its end a slow node: two partners, two independent measurements) and
    one of them confirmed. Naming a node takes its links out of its neighbours' counts.
    Returns (named, each node's candidate count, its confirmed count)."""
    a, b, by = st["a"], st["b"], st["by_node"]
    cand, conf = ev["candidate"], ev["confirmed"]
    ends = np.concatenate([a, b])
    total = by.count.astype(np.float64)
    cand_at = np.bincount(ends, weights=np.concatenate([cand, cand]), minlength=n)
    conf_at = np.bincount(ends, weights=np.concatenate([conf, conf]), minlength=n)
    counts = (cand_at.copy(), conf_at.copy())
    open_ = np.ones(n, dtype=bool)
    open_[[k for k in gone if 0 <= k < n]] = False
    named: list[int] = []
    while n:
        eligible = open_ & (total >= 2) & (cand_at >= 2) & (conf_at >= 1)
        share = np.where(eligible, cand_at / np.maximum(total, 1), 0.0)
        best = int(np.argmax(share))
        if share[best] <= 0.5:
            break
        named.append(best)
        open_[best] = False
        _, ids = by.of(best)
        others = np.where(a[ids] == best, b[ids], a[ids])
        np.subtract.at(total, others, 1)
        np.subtract.at(cand_at, others, cand[ids])
        np.subtract.at(conf_at, others, conf[ids])
    return named, *counts


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
