"""The robust statistics of a set of link readings, from plain data (numpy, no torch): what
is typical, how far a reading may fall below it, and how repeated readings of one link merge.

Robust, with no fixed Gb/s: the typical bandwidth is the median of the nodes'
median links (a slow node moves its own median, not the others'); the spread is 1.4826 times
the MAD of the links within MIN_DROP of it (a slow node's links do not inflate it). A
link is slow below typical - max(K_MAD x spread, MIN_DROP x typical) (that drop capped at
MAX_DROP x typical: a link at under 40% of typical is slow however noisy the rest), or below
`--min-link-gbps`.

CPU starvation. A rank that waits for a CPU moves data at the CPU's pace, not the link's, so
each transfer carries its ends' run-queue wait (`bandwidth`); a measurement where the two ends
together waited more than `STARVED_FRACTION` of the transfer is starved. A link is `starved`
when every measurement of it was (its best reading then says only that the link is at least
that fast). A starved link at or above the threshold of the unstarved links (of the starved
readings themselves where every link of a rail was starved) is a lower bound above it and is
judged with them; one below it is reported as not judged (`not_judged`, a warning), never as a
slow link or node, and does not fail the run, unless its waits cannot explain it: a starved
link also carries the most it could be without them (`gbps_ceiling`: starvation slows a
transfer by at most the time waited), and one whose ceiling is itself at least MIN_MARGIN x
typical below the threshold is slow whatever the CPU did (a tc-shaped link at a fifth of the
rest, its ends woken for every burst on a loaded machine, waited for a CPU half its transfers
and was left unjudged). The confirmation rounds measure those again too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

K_MAD = 4.0
MIN_DROP = 0.25
MAX_DROP = 0.6
# A link is named only this far (a fraction of typical) below the threshold, or further, and
# only where its repeats spread less than that distance (`verdict`): between the threshold and
# this margin a reading is "not judged" (borderline), never slow.
MIN_MARGIN = 0.1
# A transfer is CPU-starved when its two ends together waited more than this fraction of it
# for a CPU. Starvation slows a transfer by at most the time waited, so one whose ends waited at
# most MIN_DROP of it ran at (1 - MIN_DROP) or more of its unstarved speed: a link at the typical
# speed cannot be pushed under the slow threshold (typical less at least MIN_DROP of it) by such
# waits. Above it the reading may be the CPU's pace, not the link's.
STARVED_FRACTION = MIN_DROP

Pair = tuple[int, int]


def arrays(links: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = len(links)
    a = np.fromiter((x["a"] for x in links), dtype=np.int64, count=count)
    b = np.fromiter((x["b"] for x in links), dtype=np.int64, count=count)
    g = np.fromiter((x["gbps"] for x in links), dtype=np.float64, count=count)
    return a, b, g


class ByNode:
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


def summarize(n: int, links: Sequence[dict], min_link_gbps: float | None) -> dict:
    a, b, g = arrays(links)
    by = ByNode(n, a, b, g)
    node_median = by.medians(high=True)
    measured = node_median[~np.isnan(node_median)]
    typical = float(np.median(measured)) if len(measured) else math.nan
    near = g[np.abs(g - typical) <= MIN_DROP * typical] if len(measured) else g[:0]
    spread = 1.4826 * float(np.median(np.abs(near - typical))) if len(near) else 0.0
    drop = min(MAX_DROP * typical, max(K_MAD * spread, MIN_DROP * typical))
    threshold = typical - drop if len(measured) else math.nan
    bar = threshold  # the readings' own, before the floor
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
        "bar": bar,
        "slow": slow,
    }


def starved_bar(n: int, links: Sequence[dict], min_link_gbps: float | None) -> dict:
    """The statistics a starved link is held against: those of the links not starved; where
    every link was, those of the starved readings themselves (each a lower bound on its link),
    so that a uniformly starved set holds no outlier, and one far below the rest stays in
    doubt."""
    judged = [x for x in links if not x.get("starved")]
    return summarize(n, judged or links, min_link_gbps)


def judgeable(
    n: int, links: Sequence[dict], min_link_gbps: float | None
) -> tuple[list[dict], list[dict], dict]:
    """(the links judged, those starved below the bar, the bar: `starved_bar`). A starved
    reading is a lower bound on its link: one at or above the bar of the unstarved readings is
    judged with them (left out, a loaded machine's starved fast links would leave a slow
    node's links to set the typical, and nothing is named or measured again). One below it
    whose ceiling (`gbps_ceiling`, None: no bound) is clearly slow too is judged: its waits
    cannot have made it slow."""
    bar = starved_bar(n, links, min_link_gbps)
    cut = bar["threshold"] - MIN_MARGIN * bar["typical"]  # NaN: no ceiling is below it
    judged, unjudged = [], []
    for x in links:
        ceiling = x.get("gbps_ceiling")
        doubt = x.get("starved") and x["gbps"] < bar["threshold"]
        doubt = doubt and not (ceiling is not None and ceiling < cut)
        (unjudged if doubt else judged).append(x)
    return judged, unjudged, bar


def by_rail(links: Sequence[dict]) -> dict[int, list[dict]]:
    """Each rail's links in their order, grouped in one pass (not a scan of every link per
    rail: issue 38's 16k ranks)."""
    out: dict[int, list[dict]] = {}
    for x in links:
        out.setdefault(x.get("rail", 0), []).append(x)
    return out


def best_of(links: Sequence[dict]) -> list[dict]:
    """Repeated measurements of one node pair on one rail (a confirmation round, or a pairing
    drawn twice) as one link, the fastest, with `measurements` (how many) and `gbps_worst` (the
    slowest reading among them, their transfers included: how far the repeats spread).
    Contention for a shared CPU, bus or switch only ever slows a transfer, so the best of
    several is the link's speed (as nccl-tests and iperf report the best); a link that is slow
    stays slow every time it is measured. `starved` stays only when every measurement was
    starved (the least starved fraction, and the higher `gbps_ceiling`): one measurement with
    both ends on a CPU is the link's own speed. Idempotent (merged links merge again with their
    counts). Order: each pair where it first appears."""
    best: dict[tuple[int, int, int], dict] = {}
    for x in links:
        a, b = x["a"], x["b"]
        key = (a, b, x.get("rail", 0)) if a <= b else (b, a, x.get("rail", 0))
        cur = best.get(key)
        worst = _worst(x)
        if cur is None:
            best[key] = {**x, "measurements": x.get("measurements", 1), "gbps_worst": worst}
            continue
        starved = _starved_both(cur.get("starved"), x.get("starved"))
        ceilings = (cur.get("gbps_ceiling"), x.get("gbps_ceiling"))
        merged = {**x} if x["gbps"] > cur["gbps"] else cur
        merged["measurements"] = cur["measurements"] + x.get("measurements", 1)
        merged["gbps_worst"] = min(cur["gbps_worst"], worst)
        merged.pop("starved", None)
        merged.pop("gbps_ceiling", None)
        if starved is not None:
            merged["starved"] = starved
            # the higher ceiling (none: unbounded), as the best reading is the higher one
            merged["gbps_ceiling"] = None if None in ceilings else max(ceilings)
        best[key] = merged
    return list(best.values())


def _worst(x: dict) -> float:
    """One measurement's (or merged link's) slowest reading: its transfers' slowest where known
    (min() of those there, without building a list: called per link, 500k times at 16k ranks)."""
    worst = x["gbps"]
    for v in (x.get("gbps_worst"), x.get("gbps_low")):
        if v is not None and v < worst:
            worst = v
    return worst


def _starved_both(a: float | None, b: float | None) -> float | None:
    """Two measurements' starvation: starved only when both were (the lesser fraction)."""
    return None if not a or not b else min(a, b)


def median(values: Sequence[float]) -> float:
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


def rounded(v: float | None) -> float | None:
    """A Gb/s figure as the report shows it: 4 decimals, None for none (or NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(v, 4)
