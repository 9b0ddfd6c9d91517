"""The multi-node check-in's verdict, from plain data (no sockets, no store, no torch).

Before torchrun's agents meet in the c10d rendezvous, every node of `lockstep preflight --nnodes
N --node-rank K ...` checks what needs no peers and posts it to node 0 (`lockstep.preflight.nodes`
does the I/O). `decide` turns what arrived into the one verdict every node prints: which node
(hostname, node rank, the ranks it would start) failed and why, which never arrived.

A check-in is {"node": K, "host": hostname, "nproc": ranks it starts, "problems": [lines]}.
"""

from __future__ import annotations

from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT
from lockstep.preflight.lines import ranges


def node_ranks(node: int, nproc: int) -> list[int]:
    """The global ranks node K's agent would start with `nproc` per node, in node order."""
    return list(range(node * nproc, (node + 1) * nproc))


def decide(
    nnodes: int,
    checkins: dict[int, dict],
    *,
    nproc: int,
    timeout_s: float,
    endpoint: str,
    duplicates: dict[int, list[str]] | None = None,
    refused: dict[int, tuple[str | None, str]] | None = None,
) -> dict:
    """{"exit_code", "ok", "failed": [{node, host, ranks, problems}], "missing": [node ranks],
    "hosts": hostnames of the failed nodes, "lines": one line per named node, "line": all}.
    Exit 1 when a node that arrived reported a problem or its check-in was refused (`refused`:
    node rank -> (the sender it claims, why): forged, malformed or replayed), else 3 when a
    node never arrived."""
    failed, lines = [], []
    for node, (claims, why) in sorted((refused or {}).items()):
        ranks = node_ranks(node, nproc)
        failed.append({"node": node, "host": claims or "?", "ranks": ranks, "problems": [why]})
        lines.append(f"node {node}'s check-in (ranks {ranges(ranks)}): {why}")
    for node in sorted(checkins):
        entry = checkins[node]
        problems = list(entry.get("problems") or [])
        problems += [
            f"node rank {node} claimed also by {host}" for host in (duplicates or {}).get(node, [])
        ]
        if problems:
            ranks = node_ranks(node, entry.get("nproc") or nproc)
            failed.append(
                {"node": node, "host": entry["host"], "ranks": ranks, "problems": problems}
            )
            lines.append(
                f"{entry['host']} (node {node}, rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}): {'; '.join(problems)}"
            )
    missing = [k for k in range(nnodes) if k not in checkins and k not in (refused or {})]
    if missing:
        lines.append(
            f"node{'s' if len(missing) > 1 else ''} {ranges(missing)} (ranks "
            f"{ranges([r for k in missing for r in node_ranks(k, nproc)])}) never checked in "
            f"within {timeout_s:g}s at {endpoint} (agent not started, or the endpoint "
            "unreachable from there)"
        )
    code = EXIT_FAIL if failed else EXIT_TIMEOUT if missing else EXIT_OK
    arrived = len(checkins)
    if code == EXIT_OK:
        line = f"check-in: {nnodes} node{'s' if nnodes > 1 else ''} ready ({nnodes * nproc} ranks)"
    else:
        named = len(failed) + len(missing)
        line = (
            f"preflight: {named} of {nnodes} nodes cannot start ({arrived} checked in): "
            + " | ".join(lines)
        )
    return {
        "ok": code == EXIT_OK,
        "exit_code": code,
        "failed": failed,
        "missing": missing,
        "hosts": [f["host"] for f in failed],
        "lines": lines,
        "line": line,
    }
