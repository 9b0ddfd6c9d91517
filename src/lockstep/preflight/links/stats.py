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


class LinkList(list):
    """Links (dicts, never changed once made) with the columns the statistics read, each made
    once (`column`): at 64k ranks every statistic's own pass over half a million dicts added up
    to seconds (issue 38). `pairing` and `best_of` make them, `take` keeps the columns made so
    far; any other list of link dicts works too, its columns made at each use."""

    __slots__ = ("cols", "memo", "merged")

    def __init__(self, rows=(), merged: bool = False):
        super().__init__(rows)
        self.cols: dict[str, np.ndarray] = {}
        self.memo: dict = {}  # `summarize`'s results, by its arguments
        self.merged = merged  # each link one pair's, with `best_of`'s fields


def column(links: Sequence[dict], name: str) -> np.ndarray:
    """One field of every link as an array (`_COLUMNS`: its type, and what an absent or None
    value reads as)."""
    cols = links.cols if isinstance(links, LinkList) else None
    if cols is not None and name in cols:
        return cols[name]
    dtype, default = _COLUMNS[name]
    if default is None:
        values = (x[name] for x in links)
    else:
        values = (default if (v := x.get(name)) is None else v for x in links)
    out = np.fromiter(values, dtype=dtype, count=len(links))
    if cols is not None:
        cols[name] = out
    return out


_COLUMNS = {  # name: (dtype, the value of an absent or None field; None: always there)
    "a": (np.int64, None),
    "b": (np.int64, None),
    "gbps": (np.float64, None),
    "rail": (np.int64, 0),
    "starved": (np.float64, 0.0),  # not starved: 0
    "gbps_ceiling": (np.float64, np.nan),  # no bound: NaN
    "gbps_worst": (np.float64, np.nan),
    "gbps_low": (np.float64, np.nan),
    "measurements": (np.int64, 1),
    "round": (np.int64, None),
    "reps": (np.int64, 0),
    "starved_reps": (np.int64, 0),
    "extra_reps": (np.int64, 0),
    "cpu_wait_known": (bool, False),
}


def take(links: Sequence[dict], index) -> LinkList:
    """The links at `index` (an array of positions, in order), with the columns made so far."""
    idx = np.asarray(index, dtype=np.int64)
    mine = isinstance(links, LinkList)
    if mine and len(idx) == len(links) and (idx == np.arange(len(idx))).all():
        return links  # all of them: the same list, its columns and results made once
    out = LinkList([links[i] for i in idx.tolist()], merged=mine and links.merged)
    if mine:
        out.cols = {k: v[idx] for k, v in links.cols.items()}
    return out


def arrays(links: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return column(links, "a"), column(links, "b"), column(links, "gbps")


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
    """What is typical, the spread and the threshold of `links` (read, never changed: a
    `LinkList` keeps the result for the same arguments)."""
    memo = links.memo if isinstance(links, LinkList) else {}
    key = ("summarize", n, min_link_gbps)
    if key not in memo:
        memo[key] = _summarize(n, links, min_link_gbps)
    return memo[key]


def _summarize(n: int, links: Sequence[dict], min_link_gbps: float | None) -> dict:
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
    judged = np.flatnonzero(column(links, "starved") == 0)
    return summarize(n, take(links, judged) if len(judged) else links, min_link_gbps)


def judgeable(
    n: int, links: Sequence[dict], min_link_gbps: float | None
) -> tuple[list[dict], list[dict], dict]:
    """(the links judged, those starved below the bar, the bar: `starved_bar`). A starved
    reading is a lower bound on its link: one at or above the bar of the unstarved readings is
    judged with them (left out, a loaded machine's starved fast links would leave a slow
    node's links to set the typical, and nothing is named or measured again). One below it
    whose ceiling (`gbps_ceiling`, None: no bound) is clearly slow too is judged: its waits
    cannot have made it slow."""
    doubt, bar = starved_doubt(n, links, min_link_gbps)
    return take(links, np.flatnonzero(~doubt)), take(links, np.flatnonzero(doubt)), bar


def starved_doubt(
    n: int, links: Sequence[dict], min_link_gbps: float | None
) -> tuple[np.ndarray, dict]:
    """Per link, whether it is one `judgeable` leaves out (starved below the bar, its ceiling
    not clearly slow); and the bar."""
    bar = starved_bar(n, links, min_link_gbps)
    cut = bar["threshold"] - MIN_MARGIN * bar["typical"]  # NaN: no ceiling is below it
    below = column(links, "gbps") < bar["threshold"]
    doubt = (column(links, "starved") != 0) & below & ~(column(links, "gbps_ceiling") < cut)
    return doubt, bar


def by_rail(links: Sequence[dict]) -> dict[int, list[dict]]:
    """Each rail's links in their order, grouped at once (not a scan of every link per rail:
    issue 38's 16k ranks), in the order each rail first appears."""
    rail = column(links, "rail")
    rails, first = np.unique(rail, return_index=True)
    order = np.argsort(rail, kind="stable")
    bounds = np.searchsorted(rail[order], rails)
    groups = np.split(order, bounds[1:])
    return {
        int(rails[k]): take(links, groups[k]) for k in np.argsort(first, kind="stable").tolist()
    }


def best_of(links: Sequence[dict]) -> list[dict]:
    """Repeated measurements of one node pair on one rail (a confirmation round, or a pairing
    drawn twice) as one link, the fastest, with `measurements` (how many) and `gbps_worst` (the
    slowest reading among them, their transfers included: how far the repeats spread).
    Contention for a shared CPU, bus or switch only ever slows a transfer, so the best of
    several is the link's speed (as nccl-tests and iperf report the best); a link that is slow
    stays slow every time it is measured. `starved` stays only when every measurement was
    starved (the least starved fraction, and the higher `gbps_ceiling`): one measurement with
    both ends on a CPU is the link's own speed. Idempotent (merged links merge again with their
    counts). Order: each pair where it first appears. A pair measured once is its link as it
    is where the link carries both fields already (`pairing` builds them so): at 64k ranks
    nearly every pair, and a copy of each was seconds (issue 38)."""
    a, b, rail = column(links, "a"), column(links, "b"), column(links, "rail")
    if not len(a):
        return LinkList()
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((np.arange(len(a)), rail, hi, lo))  # each pair's in their order
    k = np.stack([lo, hi, rail])[:, order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (k[:, 1:] != k[:, :-1]).any(axis=0)
    starts = np.flatnonzero(new)
    sizes = np.diff(np.append(starts, len(order)))
    first = order[starts]  # each pair's first appearance
    keep = isinstance(links, LinkList) and links.merged  # each carries this one's fields
    if keep and len(first) == len(links):
        return links  # every link its own pair already (`first` is then every position)
    groups = np.argsort(first, kind="stable")  # the pairs in the order they first appear
    out: list[dict] = []
    merged: list[int] = []
    for i, count, begin in zip(
        first[groups].tolist(), sizes[groups].tolist(), starts[groups].tolist(), strict=True
    ):
        x = links[i]
        if count == 1:
            out.append(x if keep or ("measurements" in x and "gbps_worst" in x) else _first(x))
            continue
        merged.append(len(out))
        cur = _first(x)
        for j in order[begin + 1 : begin + count].tolist():
            cur = _merge(cur, links[j])
        out.append(cur)
    result = LinkList(out, merged=True)
    if isinstance(links, LinkList):  # the columns `_first` keeps, a merged pair's made anew
        at = first[groups]
        made = ("measurements", "gbps_worst")  # by `_first`, unless the links carried them
        result.cols = {k: v[at] for k, v in links.cols.items() if links.merged or k not in made}
        for name, col in result.cols.items():
            default = _COLUMNS[name][1]
            for i in merged:
                v = out[i].get(name) if default is not None else out[i][name]
                col[i] = default if v is None else v
    return result


def _first(x: dict) -> dict:
    return {**x, "measurements": x.get("measurements", 1), "gbps_worst": _worst(x)}


def _merge(cur: dict, x: dict) -> dict:
    """A pair's measurements so far (`cur`) with one more (`x`)."""
    starved = _starved_both(cur.get("starved"), x.get("starved"))
    ceilings = (cur.get("gbps_ceiling"), x.get("gbps_ceiling"))
    merged = {**x} if x["gbps"] > cur["gbps"] else cur
    merged["measurements"] = cur["measurements"] + x.get("measurements", 1)
    merged["gbps_worst"] = min(cur["gbps_worst"], _worst(x))
    merged.pop("starved", None)
    merged.pop("gbps_ceiling", None)
    if starved is not None:
        merged["starved"] = starved
        # the higher ceiling (none: unbounded), as the best reading is the higher one
        merged["gbps_ceiling"] = None if None in ceilings else max(ceilings)
    return merged


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
    a, b, g = arrays(links)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    # per pair the slowest, the first of equals: sorted by pair, Gb/s, then position
    order = np.lexsort((np.arange(len(a)), g, hi, lo))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (lo[order][1:] != lo[order][:-1]) | (hi[order][1:] != hi[order][:-1])
    return take(links, order[new])


def rounded(v: float | None) -> float | None:
    """A Gb/s figure as the report shows it: 4 decimals, None for none (or NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(v, 4)
