"""Rank 0's links from the ranks' records of the link stage: each record is one rank's side of
one pair in one round (`measure.measure_pair`); the two sides of a pair and round make a link
(its nodes, rail, both directions' bandwidth, the slower one as the link's, what the
measurements carry). Kept between passes (`Pairing`): each pass only adds records, so the
links of the passes before are built once, not again at the end (issue 38: at 16k ranks the
pairing was most of rank 0's link time).
"""

from __future__ import annotations

from lockstep.preflight.links import measure
from lockstep.preflight.links.layout import Layout


def pair_links(lay: Layout, records: dict[int, list[dict]]) -> tuple[list[dict], list[dict]]:
    """Per-rank records -> links between nodes (a, b, rail, gbps both ways, what the
    measurements carry: latency) and intra-node links, each in (lower rank, higher rank,
    round) order."""
    return Pairing(lay).links(records)


class Pairing:
    """The links of the records seen so far. `links(records)` again, after records were added
    to the end of each rank's list (as `results.Exchange` adds a pass's), reads only the new
    records and builds only the links they touch. The links are shared between the calls'
    lists: they are read, never changed, downstream."""

    def __init__(self, lay: Layout):
        self.lay = lay
        self._pairs: dict[tuple[int, int, int], list] = {}  # key -> [lower's, higher's, intra]
        self._links: dict[tuple[int, int, int], dict] = {}
        self._seen: dict[int, int] = {}  # rank -> how many of its records are paired

    def links(self, records: dict[int, list[dict]]) -> tuple[list[dict], list[dict]]:
        touched = set()
        for rank, recs in records.items():
            done = self._seen.get(rank, 0)
            if done > len(recs):
                raise ValueError(f"rank {rank} has fewer link records than were paired")
            for rec in recs[done:] if done else recs:
                peer = rec["peer"]
                key = (rank, peer, rec["round"]) if rank < peer else (peer, rank, rec["round"])
                entry = self._pairs.get(key)
                if entry is None:
                    entry = self._pairs[key] = [None, None, rec["intra"]]
                entry[0 if rank < peer else 1] = rec
                touched.add(key)
            self._seen[rank] = len(recs)
        carried = measure.carried()
        for key in touched:
            ab, ba, _ = self._pairs[key]
            self._links[key] = _link(self.lay, key, ab, ba, carried)
        cross, intra = [], []
        for key in sorted(self._links):
            (intra if self._pairs[key][2] else cross).append(self._links[key])
        return cross, intra


def _link(lay: Layout, key: tuple[int, int, int], ab, ba, carried: tuple[str, ...]) -> dict:
    """One link from its two directions' records (`ab`: the lower rank's; either may be
    missing): it reads as its slower direction. Straight-line code (min() and sum() as they
    would take the directions in order): it runs once per link, 250k times at 16k ranks."""
    x = ab if ab is not None else ba
    y = ba if x is ab else None  # the second direction, where both were measured
    gbps = x["gbps_out"]
    low = x.get("gbps_low_out", gbps)
    trusted = None if x.get("starved") else gbps  # the least unstarved reading
    reps = 0 + x.get("reps", 0)  # each as sum() adds: from 0, in order
    starved_reps = 0 + x.get("starved_reps", 0)
    extra_reps = 0 + x.get("extra_reps", 0)
    known = bool(x.get("cpu_wait_known"))
    if y is not None:
        g = y["gbps_out"]
        if g < gbps:
            gbps = g
        g_low = y.get("gbps_low_out", g)
        if g_low < low:
            low = g_low
        if not y.get("starved") and (trusted is None or g < trusted):
            trusted = g
        reps += y.get("reps", 0)
        starved_reps += y.get("starved_reps", 0)
        extra_reps += y.get("extra_reps", 0)
        known = known or bool(y.get("cpu_wait_known"))
    lo, hi, rnd = key
    node, rail = lay.place(lo)
    link = {
        "a": node,
        "b": lay.node_of(hi),
        "rail": rail,
        "ranks": [lo, hi],
        "round": rnd,
        "gbps": gbps,
        "gbps_ab": None if ab is None else ab["gbps_out"],
        "gbps_ba": None if ba is None else ba["gbps_out"],
        "gbps_low": low,  # the slowest transfer either way: how far the repeats spread
    }
    for name in carried:
        link[name] = None if ab is None else ab.get(name)
    link["reps"], link["starved_reps"], link["extra_reps"] = reps, starved_reps, extra_reps
    link["cpu_wait_known"] = known
    # That reading is in doubt only when it came from a direction starved in every transfer
    # (an unstarved one as slow settles it).
    if trusted is None or trusted > gbps:
        dirs = (x,) if y is None else (x, y)
        setting = [d for d in dirs if d.get("starved") and d["gbps_out"] == gbps]
        link["starved"] = max(d["starved"] for d in setting)
        # the most the link could be (`bandwidth`): none where a direction has no bound
        ceilings = [d.get("gbps_ceiling_out") for d in setting]
        link["gbps_ceiling"] = None if None in ceilings else max(ceilings)
    return link
