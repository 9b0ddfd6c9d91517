"""The preflight report as JSON (`--json`, docs/json.md): compact, and written in time linear
in its size, so the report of a job of 64k ranks costs about a second, not minutes.

Rank 0's report in memory holds every rank and every link measured (the terminal's tables and
the link plot read it); the JSON document says the same facts in less: a set of ranks is one
`ranges` string (`0-7,9`), an outlier group names its ranks so and carries the identities of its
first few ranks, and past the full matrix (32 nodes) the links keep only the rows a finding or
a not-judged warning names plus the slowest of each rail, with their statistics beside them.
Each row of a table is one line; each distinct string is scrubbed once (`scrubbed`).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable
from pathlib import Path

from lockstep.preflight.lines import ranges
from lockstep.redact import is_secret_name, redact_value, scrub_text

SLOWEST_KEPT = 40  # a sampled schedule's slowest rows kept, per rail (the terminal lists 40)
IDENTITIES_SHOWN = 16  # an outlier group's first ranks given with their identities


def write(report: dict, path: Path) -> None:
    """The report's JSON document at `path`, scrubbed of credentials (`scrubbed`)."""
    path.write_text(scrubbed(document(report)) + "\n")


_TABLES = (("nodes",), ("links", "nodes"), ("links", "links"), ("links", "intra"))


def scrubbed(doc: dict) -> str:
    """`doc`'s text, scrubbed of credentials in time linear in its size: the tables of a row per
    node or link (`_TABLES`) value by value, each distinct string scrubbed once and the whole
    value under a secret name redacted (`redact_value`); the rest as one text."""
    rest = dict(doc)
    if isinstance(rest.get("links"), dict):
        rest["links"] = dict(rest["links"])
    tables = []
    for path in _TABLES:
        holder = _holder(rest, path)
        if holder is not None and isinstance(holder.get(path[-1]), list):
            tables.append((path, holder[path[-1]]))
            holder[path[-1]] = []
    text = scrub_text(dumps(rest))
    if not tables:
        return text
    rest = json.loads(text)
    seen: dict[str, str] = {}
    for path, rows in tables:
        _holder(rest, path)[path[-1]] = [_value("", x, seen) for x in rows]
    return dumps(rest)


def _holder(doc: dict, path: tuple[str, ...]) -> dict | None:
    holder = doc if len(path) == 1 else doc.get(path[0])
    return holder if isinstance(holder, dict) else None


def _value(name: object, value: object, seen: dict[str, str]) -> object:
    """`redact_value`, with each distinct string scrubbed once (`seen`)."""
    if is_secret_name(name):
        return redact_value(name, value)
    if isinstance(value, str):
        if value not in seen:
            seen[value] = scrub_text(value)
        return seen[value]
    if isinstance(value, dict):
        return {_value("", k, seen): _value(k, v, seen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else _value(name, v, seen) for v in value]
    return value


_PLAIN = frozenset({int, float, bool, type(None)})  # nothing to scrub in these


def document(report: dict) -> dict:
    """The report as docs/json.md describes it (`REPORT_SCHEMA`): rank lists as ranges, the
    link rows cut past the full matrix; every other key as it is."""
    doc = dict(report)
    if "checks" in doc:
        doc["checks"] = [c | {"ranks": ranges(c["ranks"])} for c in doc["checks"]]
    if "comparison" in doc:
        doc["comparison"] = _comparison(doc["comparison"])
    if "collectives" in doc:
        doc["collectives"] = {
            name: c | {"failed_ranks": ranges(c["failed_ranks"])}
            for name, c in doc["collectives"].items()
        }
    if "odd_ranks" in doc.get("matmul", {}):
        doc["matmul"] = doc["matmul"] | {"odd_ranks": ranges(doc["matmul"]["odd_ranks"])}
    if doc.get("links") is not None:
        doc["links"] = _links(doc["links"])
    return doc


def _comparison(comparison: dict) -> dict:
    outliers = []
    for outlier in comparison["outliers"]:
        shown = outlier["ranks"][:IDENTITIES_SHOWN]
        outliers.append(
            {
                "ranks": ranges(i["rank"] for i in outlier["ranks"]),
                "hosts": sorted({i["host"] for i in outlier["ranks"]}),
                "identities": [{k: v for k, v in i.items() if k != "checks"} for i in shown],
                "fields": outlier["fields"],
            }
        )
    return comparison | {
        "groups": [ranges(g) for g in comparison["groups"]],
        "majority": ranges(comparison["majority"]),
        "outliers": outliers,
        "duplicate_gpus": [d | {"ranks": ranges(d["ranks"])} for d in comparison["duplicate_gpus"]],
    }


def _links(links: dict) -> dict:
    """The link section: `links`/`intra` whole on the full schedule (every pair measured, up to
    32 nodes, with `matrix_gbps`); on the sampled one, without the matrix, the rows named
    (slow, not judged) and the slowest of each rail; `summary`: how many rows were measured and
    kept, and the Gb/s and latency statistics of all of them."""
    cross, intra = links["links"], links["intra"]
    pairs = {(min(s["nodes"]), max(s["nodes"]), s["rail"]) for s in links["slow_links"]}
    pairs |= {(min(s["nodes"]), max(s["nodes"]), s["rail"]) for s in links["not_judged"]
              if "nodes" in s}  # fmt: skip
    ends = {(s["node"], s.get("rail")) for s in links["slow_nodes"] if not s.get("intra")}
    whole = {s["node"] for s in [*links["slow_nodes"], *links["not_judged"]] if s.get("intra")}

    def named(x: dict) -> bool:
        a, b, rail = x["a"], x["b"], x["rail"]
        return (min(a, b), max(a, b), rail) in pairs or (a, rail) in ends or (b, rail) in ends

    out = dict(links)
    if links["schedule"] == "full":
        kept, kept_intra = cross, intra
    else:
        kept = _kept(cross, named if pairs or ends else None)
        kept_intra = _kept(intra, (lambda x: x["a"] in whole) if whole else None)
        out.pop("matrix_gbps", None)  # a sampled schedule's: mostly pairs never measured
    return out | {
        "silent_ranks": ranges(links["silent_ranks"]),
        "links": [_clean(x) for x in kept],
        "intra": [_clean(x) for x in kept_intra],
        "summary": {"links": _stats(cross, kept), "intra": _stats(intra, kept_intra)},
    }


def _kept(rows: list[dict], named: Callable[[dict], bool] | None) -> list[dict]:
    """The `named` rows and each rail's `SLOWEST_KEPT` slowest, in their order."""
    gbps = [x["gbps"] for x in rows]
    by_rail: dict[object, list[int]] = {}
    for i, x in enumerate(rows):
        by_rail.setdefault(x.get("rail"), []).append(i)
    keep = {i for i, x in enumerate(rows) if named(x)} if named else set()
    for idx in by_rail.values():
        keep.update(heapq.nsmallest(SLOWEST_KEPT, idx, key=gbps.__getitem__))
    return [rows[i] for i in sorted(keep)]


def _stats(rows: list[dict], kept: list[dict]) -> dict:
    """How many rows were measured and kept; min, median and max of `gbps` and `latency_us`
    over all of them (None where none), rounded as the rows are (`as_shown`: rounding keeps the
    order, so these are the rounded rows' own)."""
    out: dict[str, object] = {"measured": len(rows), "kept": len(kept)}
    for key in ("gbps", "latency_us"):
        known = sorted([v for x in rows if (v := x.get(key)) is not None and v == v])
        picks = (known[0], known[len(known) // 2], known[-1]) if known else ()
        low, mid, high = map(as_shown, picks) if picks else (None, None, None)
        out[key] = {"min": low, "median": mid, "max": high} if picks else None
    return out


def _clean(x: dict) -> dict:
    """A link row as the JSON shows it: floats to 4 decimals, NaN as null (only the rows kept:
    at 16k ranks rounding every link measured took seconds)."""
    return {k: (as_shown(v) if isinstance(v, float) else v) for k, v in x.items()}


def as_shown(v: object) -> object:
    """A link figure as the report shows it: a float to 4 decimals (NaN: None), else as it is
    (the rows in memory are as measured)."""
    return None if v != v else round(v, 4) if isinstance(v, float) else v


def dumps(value: object, indent: str = "") -> str:
    """JSON, keys sorted, objects indented by 2; a list of objects or lists one element a line
    (a table's row on one line), every other list on one line."""
    if isinstance(value, dict) and value:
        inner = indent + "  "
        named = ((k if isinstance(k, str) else _one(k), v) for k, v in value.items())
        items = (
            f"{inner}{_one(k)}: {dumps(v, inner)}" for k, v in sorted(named, key=lambda kv: kv[0])
        )
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(x, dict | list) for x in value):
        inner = indent + "  "
        return "[\n" + ",\n".join(inner + _one(x) for x in value) + "\n" + indent + "]"
    return _one(value)


def _one(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
