"""Render rank 0's preflight report: a rich table, the JSON (`report_json`), a GitHub step
summary. Ranks are written as ranges (`0-7,9`), so the texts stay short at any scale.

Every text leaves through `scrub_text`, a last guard for credentials inside URLs; values of
secret-looking variables were already replaced by salted hashes at collection.
"""

from __future__ import annotations

import heapq
from collections import Counter
from pathlib import Path

from lockstep.env.summary import cell
from lockstep.launch.hostlist import compress
from lockstep.preflight import report_json
from lockstep.preflight.lines import ranges
from lockstep.preflight.verdict import tied_groups
from lockstep.redact import escape_controls, scrub_text
from lockstep.summary_md import md_cell, step_summary

_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def emit(report: dict, json_path: Path | None, drain_path: Path | None = None) -> None:
    if json_path is not None:
        report_json.write(report, json_path)
    if drain_path is not None:
        drain_path.write_text(
            "".join(f"{host}\t{reason}\n" for host, reason in drain_lines(report))
        )
    print_console(report)
    step_summary(scrub_text(markdown(report)))


def drain_lines(report: dict) -> list[tuple[str, str]]:
    """(host, reason) of each node to drain; a tab or line break in either (a hostname is a
    rank's own claim) would split a line, so none is left in."""
    out = []
    for entry in report.get("drain") or []:
        host, reason = (escape_controls(scrub_text(str(entry[k]))) for k in ("host", "reason"))
        out.append((host.replace(" ", "_"), reason))
    return out


def outlier_rows(report: dict) -> list[tuple[str, ...]]:
    """(rank, host, local rank, GPU, field, value, majority value) per outlier rank and field."""
    rows = []
    for outlier in report["comparison"]["outliers"]:
        for ident in outlier["ranks"]:
            gpu = ident["gpu"]["uuid"] if ident.get("gpu") else "-"
            for f in outlier["fields"]:
                rows.append(
                    (
                        str(ident["rank"]),
                        ident["host"],
                        _show(ident["local_rank"]),
                        gpu,
                        f["field"],
                        _show(f["value"]),
                        _show(f["expected"]),
                    )
                )
    return rows


_NODE_ROWS = 64  # nodes listed one a row up to this many; past it, the named ones and the rest


def node_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """(node, host, addresses, ranks) per node; past `_NODE_ROWS` nodes, the nodes a problem
    names one a row and one row for all of them (a Slurm host list, `--json` has each)."""
    nodes = report["nodes"]
    named = set(report.get("failed_hosts") or []) | {d["host"] for d in report.get("drain") or []}
    shown = nodes if len(nodes) <= _NODE_ROWS else [n for n in nodes if n["host"] in named]
    rows = [
        (_show(n["node"]), n["host"], ",".join(n.get("addresses", [])) or "-", ranges(n["ranks"]))
        for n in shown[:_NODE_ROWS]
    ]
    if len(nodes) > _NODE_ROWS:
        sizes = sorted({len(n["ranks"]) for n in nodes})
        each = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
        rows.append(
            (
                f"all {len(nodes)}",
                compress([n["host"] for n in nodes]),
                "each in --json",
                f"{ranges(r for n in nodes for r in n['ranks'])} ({each} a node)",
            )
        )
    return rows


def _show(value: object) -> str:
    return "-" if value is None else str(value)


def _verdict(report: dict) -> str:
    """The verdict line. PASS only where every value read was signed with the job key
    (`preflight.store`); without a key the same exit 0 says UNAUTHENTICATED."""
    ranks, nodes = report["world_size"], len(report["nodes"])
    head = f"{ranks} rank{'s' if ranks != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''}"
    authenticated = report.get("authenticated", True)
    verdict = "FAIL" if not report["ok"] else "PASS" if authenticated else "UNAUTHENTICATED"
    line = f"{verdict}: {head}, {report['launcher']}, {report['backend']}, {report['elapsed_s']} s"
    if not authenticated:
        line += " (no job key, so nothing read from the store was verified: docs/preflight.md)"
    return line


def print_console(report: dict) -> None:
    from rich.table import Table

    from lockstep.terminal import console as make_console

    console = make_console()
    nodes = Table(title="lockstep preflight: nodes")
    for col in ("node", "host", "address", "ranks"):
        nodes.add_column(col)
    for row in node_rows(report):
        nodes.add_row(*(cell(c) for c in row))
    console.print(nodes)

    checks = Table(title="checks")
    for col in ("check", "status", "ranks", "detail"):
        checks.add_column(col)
    for row in _check_rows(report):
        style = _STATUS_STYLE[row[1]]
        checks.add_row(row[0], f"[{style}]{row[1]}[/]", row[2], cell(row[3]))
    console.print(checks)

    rows = outlier_rows(report)
    if rows:
        majority = ranges(report["comparison"]["majority"])
        title = f"outliers (majority: ranks {majority})"
        if tied_groups(report["comparison"]):
            title = f"ranks that differ (no majority; values compared with ranks {majority})"
        table = Table(title=title)
        for col in ("rank", "host", "local rank", "GPU", "field", "value", "majority value"):
            table.add_column(col)
        for row in rows:
            table.add_row(*(cell(c) for c in row))
        console.print(table)

    if report["bandwidth"]["sizes"]:
        bw = Table(title="all_reduce busbw (GB/s)")
        for col in ("size", "slowest rank", "busbw slowest", "busbw fastest"):
            bw.add_column(col)
        for row in report["bandwidth"]["sizes"]:
            bw.add_row(
                f"{row['bytes'] >> 10} KiB",
                str(row["slowest_rank"]),
                f"{row['busbw_gbps_slowest']:.3f}",
                f"{row['busbw_gbps_fastest']:.3f}",
            )
        console.print(bw)
    if report.get("links"):
        console.print(links_table(report["links"]))
    for label, line in _problems(report):
        console.print(f"[bold red]{label}:[/] {cell(line)}")
    for line in report["warnings"]:
        console.print(f"[yellow]warning:[/] {cell(line)}")
    if report.get("kind"):
        console.print(f"[bold red]{cell(scheduler_line(report))}[/]")
    console.print(cell(report["compared"]))
    style = "bold green" if report["ok"] else "bold red"
    console.print(f"[{style}]{_verdict(report)}[/]")


def _check_rows(report: dict) -> list[tuple[str, str, str, str]]:
    rows = [(c["name"], c["status"], ranges(c["ranks"]), c["detail"]) for c in report["checks"]]
    for name, result in report["collectives"].items():
        failed = result["failed_ranks"]
        rows.append(
            (
                name,
                "fail" if failed else "ok",
                ranges(failed) or "all",
                "checked by value",
            )
        )
    matmul = report["matmul"]
    rows.append(("matmul_checksum", matmul["status"], "all", matmul["detail"]))
    dups = report["comparison"]["duplicate_gpus"]
    rows.append(
        (
            "duplicate_gpu",
            "fail" if dups else "ok",
            ";".join(ranges(d["ranks"]) for d in dups) or "all",
            "; ".join(f"{d['uuid']} on {d['host']}" for d in dups) or "one rank per GPU",
        )
    )
    return rows


def markdown(report: dict) -> str:
    lines = [f"### lockstep preflight: {_verdict(report)}", "", md_cell(report["compared"]), ""]
    lines += ["| check | status | ranks | detail |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {md_cell(d)} |" for a, b, c, d in _check_rows(report)]
    rows = outlier_rows(report)
    if rows:
        lines += ["", "| rank | host | local rank | GPU | field | value | majority value |"]
        lines += ["|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    if report["bandwidth"]["sizes"]:
        lines += ["", "| size | slowest rank | busbw slowest GB/s | busbw fastest GB/s |"]
        lines += ["|---|---|---|---|"]
        lines += [
            f"| {r['bytes'] >> 10} KiB | {r['slowest_rank']} | {r['busbw_gbps_slowest']} "
            f"| {r['busbw_gbps_fastest']} |"
            for r in report["bandwidth"]["sizes"]
        ]
    if report.get("links"):
        lines += links_markdown(report["links"])
    lines += [""] + [f"- **{label}**: {md_cell(p)}" for label, p in _problems(report)]
    lines += [f"- warning: {md_cell(w)}" for w in report["warnings"]]
    if report.get("kind"):
        lines += ["", md_cell(scheduler_line(report))]
    return "\n".join(lines)


def _problems(report: dict) -> list[tuple[str, str]]:
    """("problem (node)", line) per problem; "problem" alone in a report without kinds."""
    entries = report.get("problem_kinds")
    if entries is None:
        return [("problem", line) for line in report["problems"]]
    return [(f"problem ({e['kind']})", e["problem"]) for e in entries]


def scheduler_line(report: dict) -> str:
    """What the verdict asks of the scheduler, one line: drain the nodes named (docs/slurm.md),
    or fix the job and keep them."""
    drain = report.get("drain") or []
    named = f"drain or exclude {report['drain_hostlist']}" if drain else ""
    if report["kind"] == "job":
        head = "job problem: fix the job (lock, image, environment, launch), keep the nodes"
        return head + (f"; and node problems: {named}" if named else "")
    return f"node problem: {named} (the job itself may run elsewhere)"


_LINK_ROWS = 40  # the terminal and the step summary list this many links, the slowest first
# why a link is not judged (`links.verdict`), in the table's words
_WHY = {"starved": "CPU-starved", "unconfirmed": "measured once"}


def _link_rows(links: dict) -> list[tuple[str, ...]]:
    """(host a, host b, local rank, Gb/s, latency us, status), the slowest links first."""
    hosts = [n["host"] for n in links["nodes"]]
    slow = {(tuple(sorted(s["nodes"])), s["rail"]) for s in links["slow_links"]}
    slow_nodes = {(s["node"], s.get("rail")) for s in links["slow_nodes"]}
    unjudged = {
        (tuple(sorted(s["nodes"])), s["rail"]): _WHY.get(s.get("why", "starved"), s.get("why"))
        for s in links.get("not_judged", [])
        if "nodes" in s
    }
    rows = []
    for x in heapq.nsmallest(_LINK_ROWS, links["links"], key=lambda x: x["gbps"]):
        pair = tuple(sorted((x["a"], x["b"])))
        if (pair, x["rail"]) in slow:
            status = "slow link"
        elif (x["a"], x["rail"]) in slow_nodes or (x["b"], x["rail"]) in slow_nodes:
            status = "slow node"
        elif (pair, x["rail"]) in unjudged:
            status = f"not judged ({unjudged[pair, x['rail']]})"
        else:
            status = "ok"
        rows.append(
            (
                hosts[x["a"]],
                hosts[x["b"]],
                str(x["rail"]),
                f"{report_json.as_shown(x['gbps']):.3f}",
                _show(report_json.as_shown(x.get("latency_us"))),
                status,
            )
        )
    return rows


def _links_title(links: dict) -> str:
    shown = min(len(links["links"]), _LINK_ROWS)
    why = Counter(s.get("why", "starved") for s in links.get("not_judged", []))
    reasons = ", ".join(f"{n} {_WHY.get(reason, reason)}" for reason, n in why.most_common())
    unjudged = f"{why.total()} not judged ({reasons})" if why else ""
    return (
        f"links: {len(links['nodes'])} nodes, {links['rounds']} rounds, {links['schedule']} "
        f"schedule, typical {links['typical_gbps']} Gb/s ({shown} of {len(links['links'])} "
        "links, slowest first" + (f"; {unjudged}" if unjudged else "") + ")"
    )


def links_table(links: dict):
    from rich.table import Table

    table = Table(title=_links_title(links))
    for col in ("host a", "host b", "rail", "Gb/s", "latency us", "status"):
        table.add_column(col)
    style = {"ok": "green", "slow link": "bold red", "slow node": "bold red"}
    for row in _link_rows(links):
        table.add_row(*(cell(c) for c in row[:5]), f"[{style.get(row[5], 'yellow')}]{row[5]}[/]")
    if links["exclude"]:
        table.caption = f"exclude: {links['exclude_hostlist']}"
    return table


def links_markdown(links: dict) -> list[str]:
    lines = ["", f"**{md_cell(_links_title(links))}**", ""]
    lines += [
        "| host a | host b | rail | Gb/s | latency us | status |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in _link_rows(links)]
    if links["exclude"]:
        lines += [
            "",
            f"exclude: `{md_cell(links['exclude_hostlist'])}` "
            f"(`sbatch --exclude={md_cell(links['exclude_hostlist'])}`)",
        ]
    return lines
