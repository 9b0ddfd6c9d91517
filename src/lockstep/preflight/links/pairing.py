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
        self._made: dict = {}  # the links made by the last call, and their keys (`_rows`)
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
    """Records' fields as the columns a `records.Batch` holds (a default where one is absent,
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
    p = _pair(c)
    cols = _values(lay, c, p)
    rows, fresh = _rows(c, p, cols, carried, made, old)
    _doubts(c, p, cols, rows, fresh)
    worst = cols["gbps_worst"].tolist()
    for i in np.flatnonzero(~p["intra"] & fresh).tolist():
        rows[i]["measurements"], rows[i]["gbps_worst"] = 1, worst[i]
    out = []
    for part, extra in ((~p["intra"], ()), (p["intra"], ("gbps_worst", "measurements"))):
        idx = np.flatnonzero(part)
        kind = LinkList([rows[i] for i in idx.tolist()], merged=not extra)
        kind.cols = {k: v[idx] for k, v in cols.items() if k not in extra}
        out.append(kind)
    return out[0], out[1]


def _pair(c: dict) -> dict:
    """The records sorted by (lower rank, higher rank, round): per link its key and the
    records of its two directions (`ab`, `ba`: -1 where missing; `x` the first present, `y`
    the second where both, else `x`), its kind (`intra`, its first record's)."""
    rank, peer, rnd = c["rank"], c["peer"], c["round"]
    lo, hi = np.minimum(rank, peer), np.maximum(rank, peer)
    side = (rank > peer).astype(np.int64)  # 0: the lower rank's record (ab), 1: ba
    order = np.lexsort((np.arange(len(rank)), side, rnd, hi, lo))  # read order kept in a tie
    k = np.stack([lo, hi, rnd])[:, order]
    new_key = np.ones(len(order), dtype=bool)
    new_key[1:] = (k[:, 1:] != k[:, :-1]).any(axis=0)
    key_id = np.cumsum(new_key) - 1
    links = int(key_id[-1]) + 1
    s = side[order]  # per link and side: the last record read
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (key_id[1:] != key_id[:-1]) | (s[1:] != s[:-1])
    ab, ba = np.full(links, -1), np.full(links, -1)
    ab[key_id[last & (s == 0)]] = order[last & (s == 0)]
    ba[key_id[last & (s == 1)]] = order[last & (s == 1)]
    first_read = np.full(links, len(rank))
    np.minimum.at(first_read, key_id, order)
    x = np.where(ab >= 0, ab, ba)
    y = np.where((ab >= 0) & (ba >= 0), ba, x)
    lo_k, hi_k, rnd_k = k[:, new_key]
    return {
        "links": links, "order": order, "key_id": key_id, "ab": ab, "ba": ba, "x": x, "y": y,
        "intra": c["intra"][first_read], "lo": lo_k, "hi": hi_k, "round": rnd_k,
    }  # fmt: skip


def _values(lay: Layout, c: dict, p: dict) -> dict[str, np.ndarray]:
    """Every link's figures at once, as `stats.LinkList`'s columns: the slower direction's
    Gb/s, the slowest transfer, the repeats summed, known if either end knew."""
    x, y = p["x"], p["y"]
    both = y != x
    node, rail = lay_arrays(lay)
    g, low = c["g"], c["low"]
    gbps = np.minimum(g[x], g[y])
    cols = {
        "a": node[p["lo"]],
        "b": node[p["hi"]],
        "gbps": gbps,
        "rail": rail[p["lo"]],
        "starved": np.zeros(p["links"]),  # set for the links in doubt (`_doubts`)
        "gbps_ceiling": np.full(p["links"], np.nan),
        "gbps_low": np.minimum(low[x], low[y]),
        "measurements": np.ones(p["links"], dtype=np.int64),
        "round": p["round"],
        "cpu_wait_known": c["known"][x] | c["known"][y],
    }
    cols["gbps_worst"] = np.minimum(cols["gbps_low"], gbps)
    for name in ("reps", "starved_reps", "extra_reps"):
        cols[name] = c[name][x] + np.where(both, c[name][y], 0)
    return cols


def _fields(c: dict, p: dict, cols: dict, carried: tuple[str, ...], at: np.ndarray) -> dict:
    """The fields of the link dicts at positions `at`, each a list (in the order a link shows
    them)."""
    lo, hi = p["lo"][at].tolist(), p["hi"][at].tolist()
    ab, ba = p["ab"][at], p["ba"][at]
    fields = {
        "a": cols["a"][at].tolist(),
        "b": cols["b"][at].tolist(),
        "rail": cols["rail"][at].tolist(),
        "ranks": [[a, b] for a, b in zip(lo, hi, strict=True)],
        "round": p["round"][at].tolist(),
        "gbps": cols["gbps"][at].tolist(),
        "gbps_ab": _maybe(c["g"], ab),
        "gbps_ba": _maybe(c["g"], ba),
        "gbps_low": cols["gbps_low"][at].tolist(),
    }
    for name in carried:
        col = c["carried:" + name]
        fields[name] = [col[i] if i >= 0 else None for i in ab.tolist()]
    for name in ("reps", "starved_reps", "extra_reps", "cpu_wait_known"):
        fields[name] = cols[name][at].tolist()
    return fields


_KEY_BITS = 21  # a link's key as one int64: (lower rank, higher rank, round), 21 bits each


def _rows(c: dict, p: dict, cols: dict, carried: tuple, made: dict, old: int):
    """The link dicts: those made before (`made`: the last call's keys and dicts) where no
    record from the `old`-th on touches them, the others made now (at once); and which were
    made now."""
    links = p["links"]
    key = (p["lo"] << (2 * _KEY_BITS)) | (p["hi"] << _KEY_BITS) | p["round"]
    fits = max(p["hi"].max(), p["round"].max()) < (1 << _KEY_BITS)
    rows: list = [None] * links
    fresh = np.ones(links, dtype=bool)
    if old and fits and made.get("keys") is not None:
        touched = np.zeros(links, dtype=bool)
        touched[p["key_id"][p["order"] >= old]] = True
        before, pos = made["keys"], np.searchsorted(made["keys"], key)
        pos = np.minimum(pos, len(before) - 1)
        fresh = touched | (before[pos] != key)
        was = made["rows"]
        for i, k in zip(np.flatnonzero(~fresh).tolist(), pos[~fresh].tolist(), strict=True):
            rows[i] = was[k]
    build = np.flatnonzero(fresh)
    fields = _fields(c, p, cols, carried, build)
    made_now = [dict(zip(fields, v, strict=True)) for v in zip(*fields.values(), strict=True)]
    if len(build) == links:
        rows = made_now
    else:
        for i, row in zip(build.tolist(), made_now, strict=True):
            rows[i] = row
    made["keys"], made["rows"] = (key, rows) if fits else (None, None)
    return rows, fresh


def _doubts(c: dict, p: dict, cols: dict, rows: list, fresh: np.ndarray) -> None:
    """The links in doubt: no unstarved direction, or the slower one was starved (an unstarved
    one as slow settles it). Each carries the starved fraction and the ceiling of the
    directions that set it (on the dicts made now, and in `cols`)."""
    x, y, gbps = p["x"], p["y"], cols["gbps"]
    g, starved = c["g"], c["starved"]
    trusted = np.minimum(
        np.where(starved[x] > 0, np.inf, g[x]), np.where(starved[y] > 0, np.inf, g[y])
    )
    for i in np.flatnonzero(~(trusted <= gbps)).tolist():
        row = rows[i]
        if fresh[i]:
            dirs = (x[i],) if y[i] == x[i] else (x[i], y[i])
            setting = [d for d in dirs if starved[d] > 0 and g[d] == gbps[i]]
            row["starved"] = max(starved[d].item() for d in setting)
            ceilings = [c["ceiling"][d] for d in setting]
            row["gbps_ceiling"] = None if np.isnan(ceilings).any() else max(ceilings).item()
        cols["starved"][i] = row["starved"]
        cols["gbps_ceiling"][i] = _nan(row["gbps_ceiling"])


def _maybe(values: np.ndarray, index: np.ndarray) -> list:
    """`values` at `index`, None where the index is -1 (that direction was not measured)."""
    out = values[np.where(index >= 0, index, 0)].tolist()
    return [v if i >= 0 else None for v, i in zip(out, index.tolist(), strict=True)]


def lay_arrays(lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """rank -> node and rank -> rail (its place among its node's ranks), as arrays."""
    world = max((max(rs) for rs in lay.ranks if rs), default=-1) + 1
    node = np.full(world, -1, dtype=np.int64)
    rail = np.full(world, -1, dtype=np.int64)
    for k, rs in enumerate(lay.ranks):
        node[rs] = k
        rail[rs] = np.arange(len(rs))
    return node, rail
