"""Rank 0's links from the ranks' records of the link stage: each record is one rank's side of
one pair in one round (`measure.measure_pair`); the two sides of a pair and round make a link
(its nodes, rail, both directions' bandwidth, the slower one as the link's, what the
measurements carry). Kept between passes (`Pairing`): each pass only adds records.

Columnar (numpy): the records' fields as arrays, the two sides of each pair found by one sort,
each link's fields computed for every link at once, and the link dicts made in bulk, with
their columns kept beside them (`stats.LinkList`). At 64k ranks a million records make half a
million links; a Python step per record or link was most of rank 0's link time (issue 38).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lockstep.preflight.links import measure
from lockstep.preflight.links.layout import Layout
from lockstep.preflight.links.records import Records
from lockstep.preflight.links.stats import LinkList


def pair_links(lay: Layout, records: dict[int, list[dict]]) -> tuple[list[dict], list[dict]]:
    """Per-rank records -> links between nodes (a, b, rail, gbps both ways, what the
    measurements carry: latency) and intra-node links, each in (lower rank, higher rank,
    round) order."""
    return Pairing(lay).links(records)


class Pairing:
    """The links of the records seen so far. `links(records)` again, after records were added
    to the end of each rank's list (as `results.Exchange` adds a pass's), reads only the new
    records."""

    def __init__(self, lay: Layout):
        self.lay = lay
        self._cols: dict[str, np.ndarray | list] = {}  # the records read so far, by field
        self._seen: dict[int, int] = {}  # rank -> how many of its records are read
        self._carried = measure.carried()
        self._made: dict[tuple[int, int, int], dict] = {}  # the links made, by pair and round
        self._batches = 0  # the passes' batches read (`records.Records`)

    def links(self, records: Mapping[int, list[dict]]) -> tuple[list[dict], list[dict]]:
        """(cross, intra) of every record so far. `records`: each rank's records, or the
        passes' own columns (`records.Records`, as `results.Exchange` holds them)."""
        before = len(self._cols.get("rank", ()))
        if isinstance(records, Records):
            for batch in records.batches[self._batches :]:
                self._append(batch.cols)
            self._batches = len(records.batches)
        else:
            new: list[tuple[int, dict]] = []
            for rank, recs in records.items():
                done = self._seen.get(rank, 0)
                if done > len(recs):
                    raise ValueError(f"rank {rank} has fewer link records than were paired")
                new += [(rank, rec) for rec in (recs[done:] if done else recs)]
                self._seen[rank] = len(recs)
            self._append(_read(new, self._carried))
        return _links(self.lay, self._cols, self._carried, self._made, before)

    def _append(self, cols: dict) -> None:
        for key, values in cols.items():
            was = self._cols.get(key)
            if key.startswith("carried:"):  # as they were: a float, an int or a bool
                self._cols[key] = [*(was or ()), *values]
            else:
                got = np.asarray(values, dtype=_DTYPES.get(key, np.float64))
                self._cols[key] = got if was is None else np.concatenate([was, got])


_DTYPES = {"intra": bool, "known": bool, "rank": np.int64, "peer": np.int64, "round": np.int64}
_DTYPES |= dict.fromkeys(("reps", "starved_reps", "extra_reps"), np.int64)


def _read(new: list[tuple[int, dict]], carried: tuple[str, ...]) -> dict[str, list]:
    """Records' fields as the columns `records.COLUMNS` names (a default where one is absent,
    as the link takes it)."""
    recs = [rec for _, rec in new]
    cols = {
        "rank": [r for r, _ in new],
        "peer": [x["peer"] for x in recs],
        "round": [x["round"] for x in recs],
        "intra": [bool(x["intra"]) for x in recs],
        "g": [x["gbps_out"] for x in recs],
        "low": [x.get("gbps_low_out", x["gbps_out"]) for x in recs],
        "starved": [x.get("starved") or 0.0 for x in recs],
        "ceiling": [_nan(x.get("gbps_ceiling_out")) for x in recs],
        "reps": [x.get("reps", 0) for x in recs],
        "starved_reps": [x.get("starved_reps", 0) for x in recs],
        "extra_reps": [x.get("extra_reps", 0) for x in recs],
        "known": [bool(x.get("cpu_wait_known")) for x in recs],
    }
    for name in carried:
        cols["carried:" + name] = [x.get(name) for x in recs]
    return cols


def _nan(v: float | None) -> float:
    return np.nan if v is None else v


def _links(lay: Layout, c: dict[str, np.ndarray], carried: tuple[str, ...], made: dict, old: int):
    """(cross, intra) from the records' columns `c`: each link reads as its slower direction;
    a direction's record is the last one read for it. `made`: the links made before, by key,
    reused where no record from the `old`-th on touches them (updated here)."""
    if not len(c.get("rank", ())):
        return LinkList(), LinkList()
    rank, peer = c["rank"].astype(np.int64), c["peer"].astype(np.int64)
    lo, hi = np.minimum(rank, peer), np.maximum(rank, peer)
    rnd = c["round"].astype(np.int64)
    side = (rank > peer).astype(np.int64)  # 0: the lower rank's record (ab), 1: ba
    order = np.lexsort((np.arange(len(rank)), side, rnd, hi, lo))  # read order kept in a tie
    k = np.stack([lo, hi, rnd])[:, order]
    new_key = np.ones(len(order), dtype=bool)
    new_key[1:] = (k[:, 1:] != k[:, :-1]).any(axis=0)
    key_id = np.cumsum(new_key) - 1
    links = int(key_id[-1]) + 1
    # per link and side: the last record read (the sort keeps read order within a side)
    s = side[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (key_id[1:] != key_id[:-1]) | (s[1:] != s[:-1])
    ab = np.full(links, -1)
    ba = np.full(links, -1)
    ab[key_id[last & (s == 0)]] = order[last & (s == 0)]
    ba[key_id[last & (s == 1)]] = order[last & (s == 1)]
    first_read = np.full(links, len(rank))
    np.minimum.at(first_read, key_id, order)
    intra = c["intra"][first_read]  # the pair's kind: its first record's
    has_ab, has_ba = ab >= 0, ba >= 0
    x = np.where(has_ab, ab, ba)  # the first direction, y the second (where both)
    y = np.where(has_ab & has_ba, ba, x)
    g, low, starved = c["g"].astype(float), c["low"].astype(float), c["starved"].astype(float)
    gbps = np.minimum(g[x], g[y])
    low_l = np.minimum(low[x], low[y])
    trusted = np.minimum(
        np.where(starved[x] > 0, np.inf, g[x]), np.where(starved[y] > 0, np.inf, g[y])
    )
    both = y != x

    def total(name: str) -> np.ndarray:
        v = c[name].astype(np.int64)
        return v[x] + np.where(both, v[y], 0)

    known = c["known"][x] | c["known"][y]
    r_lo = lo[order][new_key]
    r_hi = hi[order][new_key]
    r_rnd = rnd[order][new_key]
    node, rail = lay_arrays(lay)
    g_ab = _maybe(g, ab, has_ab)
    g_ba = _maybe(g, ba, has_ba)
    columns = {
        "a": node[r_lo].tolist(),
        "b": node[r_hi].tolist(),
        "rail": rail[r_lo].tolist(),
        "ranks": [[p, q] for p, q in zip(r_lo.tolist(), r_hi.tolist(), strict=True)],
        "round": r_rnd.tolist(),
        "gbps": gbps.tolist(),
        "gbps_ab": g_ab,
        "gbps_ba": g_ba,
        "gbps_low": low_l.tolist(),
    }
    for name in carried:
        col = c["carried:" + name]
        columns[name] = [col[i] if i >= 0 else None for i in ab.tolist()]
    columns["reps"] = total("reps").tolist()
    columns["starved_reps"] = total("starved_reps").tolist()
    columns["extra_reps"] = total("extra_reps").tolist()
    columns["cpu_wait_known"] = known.tolist()
    worst = np.minimum(low_l, gbps)
    keys = list(zip(r_lo.tolist(), r_hi.tolist(), r_rnd.tolist(), strict=True))
    fresh = np.zeros(links, dtype=bool)
    fresh[key_id[order >= old]] = True
    rows: list = [None] * links
    if old:
        for i in np.flatnonzero(~fresh).tolist():
            rows[i] = made.get(keys[i])
    build = [i for i, row in enumerate(rows) if row is None]
    if len(build) == links:
        rows = [dict(zip(columns, v, strict=True)) for v in zip(*columns.values(), strict=True)]
    elif build:
        picked = [[col[i] for i in build] for col in columns.values()]
        for i, v in zip(build, zip(*picked, strict=True), strict=True):
            rows[i] = dict(zip(columns, v, strict=True))
    built = np.zeros(links, dtype=bool)
    built[build] = True
    # in doubt: no unstarved direction, or the slower one was starved (an unstarved one as
    # slow settles it): the starved fraction and the ceiling of the directions that set it
    doubt = ~(trusted <= gbps)
    for i in np.flatnonzero(doubt & built).tolist():
        dirs = (x[i],) if not both[i] else (x[i], y[i])
        setting = [d for d in dirs if starved[d] > 0 and g[d] == gbps[i]]
        rows[i]["starved"] = max(c["starved"][d].item() for d in setting)
        ceilings = [c["ceiling"][d] for d in setting]
        rows[i]["gbps_ceiling"] = None if np.isnan(ceilings).any() else max(ceilings).item()
    worst_of = worst.tolist()
    for i in np.flatnonzero(~intra & built).tolist():
        rows[i]["measurements"], rows[i]["gbps_worst"] = 1, worst_of[i]
    for i in build:
        made[keys[i]] = rows[i]
    ceiling = np.full(links, np.nan)
    starved_l = np.zeros(links)
    for i in np.flatnonzero(doubt).tolist():
        starved_l[i] = rows[i]["starved"]
        ceiling[i] = _nan(rows[i]["gbps_ceiling"])
    cols = {
        "a": node[r_lo],
        "b": node[r_hi],
        "gbps": gbps,
        "rail": rail[r_lo],
        "starved": starved_l,
        "gbps_ceiling": ceiling,
        "gbps_worst": worst,
        "measurements": np.ones(links, dtype=np.int64),
        "round": r_rnd,
        "reps": total("reps"),
        "starved_reps": total("starved_reps"),
        "extra_reps": total("extra_reps"),
        "cpu_wait_known": known,
    }
    out = []
    for part, extra in ((~intra, ()), (intra, ("gbps_worst", "measurements"))):
        idx = np.flatnonzero(part)
        kind = LinkList([rows[i] for i in idx.tolist()], merged=not extra)
        kind.cols = {k: v[idx] for k, v in cols.items() if k not in extra}
        out.append(kind)
    return out[0], out[1]


def _maybe(values: np.ndarray, index: np.ndarray, has: np.ndarray) -> list:
    out = values[np.where(has, index, 0)].tolist()
    return [v if h else None for v, h in zip(out, has.tolist(), strict=True)]


def lay_arrays(lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """rank -> node and rank -> rail (its place among its node's ranks), as arrays."""
    world = max((max(rs) for rs in lay.ranks if rs), default=-1) + 1
    node = np.full(world, -1, dtype=np.int64)
    rail = np.full(world, -1, dtype=np.int64)
    for k, rs in enumerate(lay.ranks):
        node[rs] = k
        rail[rs] = np.arange(len(rs))
    return node, rail
