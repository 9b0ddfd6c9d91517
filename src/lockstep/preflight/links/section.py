"""The report's `links` section, from the stage's readings (plain data): each rail judged on
its own (local rank i of every node, `verdict.judge`), the findings named by host, local rank
and rank, the nodes to leave out as a Slurm host list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lockstep.launch.hostlist import compress
from lockstep.preflight.lines import ranges
from lockstep.preflight.links.schedule import FULL_MATRIX
from lockstep.preflight.links.stats import (
    MIN_MARGIN,
    STARVED_FRACTION,
    best_of,
    by_rail,
    column,
    judgeable,
    matrix,
    median,
    merge_rails,
    rounded,
)
from lockstep.preflight.links.verdict import judge, judge_intra
from lockstep.preflight.problem_kind import NODE, Problems, overall, spread_kind

MATRIX_MAX = 256  # the JSON carries the N x N matrix up to this many nodes (the links always)


@dataclass(frozen=True)
class _Nodes:
    """The stage's nodes: host names, each node's ranks in rail order, each rank's local rank."""

    hosts: Sequence[str]
    ranks: Sequence[Sequence[int]]
    local: Sequence[int | None]

    def who(self, node: int, rail: int | None = None) -> str:
        if rail is None:
            return f"{self.hosts[node]} (rank {ranges(self.ranks[node])})"
        rank = self.ranks[node][rail]
        return f"{self.hosts[node]} local rank {_show(self.local[rank])} (rank {rank})"

    def locals_of(self, ranks: Sequence[int]) -> list[int | None]:
        return [self.local[r] for r in ranks]


@dataclass
class _Findings:
    """What the section names, in the order found; `named`: each problem's finding, kind
    (node or job), hosts and Slurm reason (`problem_kind.Problems`)."""

    named: Problems = field(default_factory=Problems)
    warnings: list[str] = field(default_factory=list)
    slow_nodes: list[dict] = field(default_factory=list)
    slow_links: list[dict] = field(default_factory=list)
    not_judged: list[dict] = field(default_factory=list)
    exclude: set[int] = field(default_factory=set)

    def problem(self, finding: str, line: str, hosts: list[str], why: str, kind=NODE) -> None:
        self.named.add(line, finding, kind, hosts, why)


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
    """The report's `links` section: `problems` (one line each), `finding` (the first: dropped,
    link_error, slow_node, slow_link, or None), `kind` (node or job, `problem_kind`) and
    `exit_code` (3 when a node dropped out or a transfer failed, 1 for a slow node or link,
    else 0). Links `starved` of CPU in every measurement are judged by none of that: below the
    threshold they are `not_judged`, with a line each in `warnings`, and change neither
    `finding` nor `exit_code`."""
    failed = failed or {}
    nodes = _Nodes(hosts, ranks, local)
    measured = cross
    cross = best_of(cross)  # a pair measured again (confirmation): its best
    found = _Findings()
    silent_nodes = _dropped(nodes, silent, failed, timeout_s, found)
    rails = by_rail(cross)
    per_rail = []
    for rail in range(max((len(rs) for rs in ranks), default=0)):
        mine = rails.get(rail)
        if mine:
            per_rail.append(_rail(nodes, rail, mine, min_link_gbps, silent_nodes, found))
    if judge_intra:
        _within_nodes(nodes, intra, min_link_gbps, found)
    names = [hosts[k] for k in sorted(found.exclude)]
    findings = [e["finding"] for e in found.named.entries]
    n = len(hosts)
    out = {
        "schedule": ("full" if n <= FULL_MATRIX else "sampled"),
        "nodes": [
            {
                "node": k,
                "host": h,
                "ranks": list(ranks[k]),
                "local_ranks": nodes.locals_of(ranks[k]),
            }
            for k, h in enumerate(hosts)
        ],
        "rounds": len(np.union1d(column(measured, "round"), column(intra, "round"))),
        "bytes": nbytes,
        "min_link_gbps": min_link_gbps,
        "rails": per_rail,
        "typical_gbps": rounded(median([r["typical_gbps"] for r in per_rail]))
        if per_rail
        else None,
        "links": cross,  # as measured: the outputs round what they show (`report_json`)
        "intra": list(intra),
        "slow_nodes": found.slow_nodes,
        "slow_links": found.slow_links,
        "not_judged": found.not_judged,
        "cpu_wait": _cpu_wait(measured, cross, intra),  # `measured`: cross before `best_of`
        "warnings": found.warnings,
        "dropped": [hosts[k] for k in silent_nodes],
        "silent_ranks": sorted(silent),
        "failed_ranks": {str(r): why for r, why in sorted(failed.items())},
        "exclude": names,
        "exclude_hostlist": compress(names) if names else "",
        "problems": found.named.lines,
        "finding": findings[0] if findings else None,
        "findings": list(dict.fromkeys(findings)),
        "kind": overall(found.named.entries),
        "problem_kinds": found.named.entries,
        "exit_code": 3 if (silent_nodes or failed) else (1 if found.named.lines else 0),
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
    }
    if n <= MATRIX_MAX:
        out["matrix_gbps"] = [[rounded(v) for v in row] for row in matrix(n, merge_rails(cross))]
    return out


def _dropped(
    nodes: _Nodes,
    silent: Sequence[int],
    failed: dict[int, str],
    timeout_s: float | None,
    found: _Findings,
) -> list[int]:
    """The nodes whose ranks never posted (dropped out), and a stage that failed on some rank;
    the dropped nodes, to leave out."""
    node_of = {r: k for k, rs in enumerate(nodes.ranks) for r in rs}
    silent_nodes = sorted({node_of[r] for r in silent if r in node_of})
    for node in silent_nodes:
        gone = [r for r in silent if node_of.get(r) == node]
        found.problem(
            "dropped",
            f"node {nodes.hosts[node]} (rank {ranges(gone)}) dropped out during the link stage: "
            f"no answer within {_g(timeout_s)} s",
            [nodes.hosts[node]],
            "dropped out during the link stage",
        )
    if failed and not silent_nodes:
        first = min(failed)
        where = sorted({nodes.hosts[node_of[r]] for r in failed if r in node_of})
        found.problem(
            "link_error",
            f"the link stage failed on rank {ranges(list(failed))}: rank {first}: {failed[first]}",
            where,
            "the link stage failed here",
            spread_kind(where, nodes.hosts),
        )
    found.exclude |= set(silent_nodes)
    return silent_nodes


def _rail(
    nodes: _Nodes,
    rail: int,
    mine: list[dict],
    min_link_gbps: float | None,
    silent_nodes: list[int],
    found: _Findings,
) -> dict:
    """One rail judged: its row of `rails`, its findings into `found`; the starved readings
    below the bar are not judged (`stats.judgeable`)."""
    n = len(nodes.hosts)
    judged, unjudged, bar = judgeable(n, mine, min_link_gbps)
    v = judge(n, judged, min_link_gbps=min_link_gbps, dropped=silent_nodes, pairs_merged=True)
    for x in unjudged:
        _not_judged(nodes, rail, x, bar, found)
    for x in v["not_judged"]:
        _in_doubt(nodes, rail, x, v, found)
    for s in v["slow_nodes"]:
        _slow_node(nodes, rail, s, v["typical_gbps"], found)
    for s in v["slow_links"]:
        _slow_link(nodes, rail, s, v["typical_gbps"], found)
    found.exclude |= set(v["exclude"])
    return {
        "rail": rail,
        "typical_gbps": rounded(v["typical_gbps"]),
        "spread_gbps": rounded(v["spread_gbps"]),
        "threshold_gbps": rounded(v["threshold_gbps"]),
        "min_margin_gbps": rounded(v["min_margin_gbps"]),
        "links": len(mine),
        "starved": len(unjudged),
        "in_doubt": len(v["not_judged"]),
    }


def _link_row(nodes: _Nodes, rail: int, x: dict, typical: float) -> dict:
    """A named or not-judged link's row in the report: where it is and what it read."""
    a, b = x["a"], x["b"]
    return {
        "hosts": [nodes.hosts[a], nodes.hosts[b]],
        "nodes": [a, b],
        "rail": rail,
        "ranks": x["ranks"],
        "local_ranks": nodes.locals_of(x["ranks"]),
        "gbps": rounded(x["gbps"]),
        "typical_gbps": rounded(typical),
    }


def _not_judged(nodes: _Nodes, rail: int, x: dict, bar: dict, found: _Findings) -> None:
    """A starved link below the bar whose waits could explain it (`stats.judgeable`): its
    ceiling (None: no bound) reaches the threshold less the margin."""
    a, b = x["a"], x["b"]
    typical, ceiling = bar["typical"], x.get("gbps_ceiling")
    found.not_judged.append(
        _link_row(nodes, rail, x, typical)
        | {
            "starved": rounded(x["starved"]),
            "why": "starved",
            "gbps_ceiling": rounded(ceiling),
            "threshold_gbps": rounded(bar["threshold"]),
            "min_margin_gbps": rounded(MIN_MARGIN * typical),
        }
    )
    most = "no bound" if ceiling is None else f"up to {rounded(ceiling)}"
    found.warnings.append(
        f"link {nodes.who(a, rail)} <-> {nodes.who(b, rail)} not judged: CPU-starved, its ends "
        f"waited for a CPU {x['starved']:.0%} of the transfer in every measurement "
        f"({rounded(x['gbps'])} Gb/s measured, {most} without those waits, typical "
        f"{rounded(typical)} Gb/s)"
    )


_DOUBT = {
    "borderline": "within the margin below the threshold",
    "noisy": "its repeats spread wider than its distance below the threshold",
    "unconfirmed": "slow in one measurement only",
}


def _in_doubt(nodes: _Nodes, rail: int, x: dict, v: dict, found: _Findings) -> None:
    """A link read below the threshold but not named (`verdict.evidence`): not judged."""
    a, b = x["a"], x["b"]
    found.not_judged.append(
        _link_row(nodes, rail, x, v["typical_gbps"])
        | {
            "why": x["why"],
            "gbps_worst": rounded(x["gbps_worst"]),
            "measurements": x["measurements"],
            "threshold_gbps": rounded(v["threshold_gbps"]),
            "margin_gbps": rounded(x["margin_gbps"]),
            "min_margin_gbps": rounded(v["min_margin_gbps"]),
            "noise_gbps": rounded(x["noise_gbps"]),
        }
    )
    found.warnings.append(
        f"link {nodes.who(a, rail)} <-> {nodes.who(b, rail)} not judged: {x['why']}, "
        f"{_DOUBT[x['why']]} ({rounded(x['gbps'])} Gb/s at best, {rounded(x['gbps_worst'])} at "
        f"worst in {x['measurements']} measurement(s); threshold "
        f"{rounded(v['threshold_gbps'])} Gb/s, margin needed {rounded(v['min_margin_gbps'])})"
    )


def _slow_node(nodes: _Nodes, rail: int, s: dict, typical: float, found: _Findings) -> None:
    node = s["node"]
    found.slow_nodes.append(
        {
            "host": nodes.hosts[node],
            "node": node,
            "rail": rail,
            "local_rank": nodes.local[nodes.ranks[node][rail]],
            "rank": nodes.ranks[node][rail],
            "median_gbps": rounded(s["median_gbps"]),
            "typical_gbps": rounded(typical),
            "slow_links": s["slow"],
            "confirmed_links": s["confirmed"],
            "links": s["links"],
            "margin_gbps": rounded(s["margin_gbps"]),
        }
    )
    found.problem(
        "slow_node",
        f"slow node {nodes.who(node, rail)}: median link {rounded(s['median_gbps'])} Gb/s vs "
        f"typical {rounded(typical)} Gb/s ({s['slow']} of {s['links']} links slow)",
        [nodes.hosts[node]],
        f"slow node {nodes.hosts[node]}",
    )


def _slow_link(nodes: _Nodes, rail: int, s: dict, typical: float, found: _Findings) -> None:
    a, b = s["a"], s["b"]
    hosts = nodes.hosts
    found.slow_links.append(
        _link_row(nodes, rail, s, typical)
        | {
            "others_gbps": [rounded(x) for x in s["others_gbps"]],
            "exclude": [hosts[e] for e in s["exclude"]],
            "measurements": s["measurements"],
            "margin_gbps": rounded(s["margin_gbps"]),
            "noise_gbps": rounded(s["noise_gbps"]),
        }
    )
    found.problem(
        "slow_link",
        f"slow link {nodes.who(a, rail)} <-> {nodes.who(b, rail)}: {rounded(s['gbps'])} Gb/s vs "
        f"typical {rounded(typical)} Gb/s; their other links {rounded(s['others_gbps'][0])} and "
        f"{rounded(s['others_gbps'][1])} Gb/s; exclude {', '.join(hosts[e] for e in s['exclude'])}",
        [hosts[e] for e in s["exclude"]],
        f"slow link {hosts[a]}<->{hosts[b]}",
    )


def _within_nodes(
    nodes: _Nodes, intra: Sequence[dict], min_link_gbps: float | None, found: _Findings
) -> None:
    """The bandwidth between the ranks of each node (GPUs: NVLink or PCIe), judged."""
    slow, starved = judge_intra(len(nodes.hosts), intra, min_link_gbps)
    for s in starved:
        node = s["node"]
        found.not_judged.append({**s, "host": nodes.hosts[node], "intra": True})
        found.warnings.append(
            f"node {nodes.who(node)} within the node not judged: CPU-starved, its ranks waited "
            f"for a CPU {s['starved']:.0%} of the transfer in every measurement "
            f"({s['gbps']} Gb/s measured, typical {s['typical_gbps']} Gb/s)"
        )
    for s in slow:
        node = s["node"]
        found.slow_nodes.append({**s, "host": nodes.hosts[node], "intra": True})
        found.problem(
            "slow_node",
            f"slow node {nodes.who(node)} within the node: {s['gbps']} Gb/s between its ranks "
            f"vs typical {s['typical_gbps']} Gb/s",
            [nodes.hosts[node]],
            f"slow node {nodes.hosts[node]} within the node",
        )
        found.exclude.add(node)


def _cpu_wait(measured: Sequence[dict], cross: Sequence[dict], intra: Sequence[dict]) -> dict:
    """The stage's transfers and how many were CPU-starved (`STARVED_FRACTION`) and measured
    again, over every measurement (both directions of each: `measured` between nodes, `intra`
    within); `known`: whether any rank could read its run-queue wait. `cross`: merged already
    (`best_of`); a link between two nodes never merges with one within a node (a node with
    itself), so only `intra` is merged here, unless a record's round says otherwise (a peer
    elsewhere): then every measurement is merged anew."""
    out: dict = {"threshold": STARVED_FRACTION}
    for key in ("reps", "starved_reps", "extra_reps"):
        out[key] = int(column(measured, key).sum() + column(intra, key).sum())
    apart = bool((column(cross, "a") != column(cross, "b")).all())
    apart = apart and bool((column(intra, "a") == column(intra, "b")).all())
    if apart:
        starved = [column(cross, "starved"), column(best_of(intra), "starved")]
    else:
        starved = [column(best_of([*measured, *intra]), "starved")]
    out["starved_links"] = int(sum((s != 0).sum() for s in starved))
    known = column(measured, "cpu_wait_known").any() or column(intra, "cpu_wait_known").any()
    out["known"] = bool(known)
    return out


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def _show(v: object) -> str:
    return "-" if v is None else str(v)
