"""The ranks' check-in, one signed record a node (issue 38).

Each node's leader (local rank 0) gathers its ranks' identities over the node's own channel
(`node_channel`) and posts ONE record for the node in lockstep's store: its identities, the
local ranks that never reached it, and what it refused there. Only leaders touch the check-in's
store keys. A node claims a slot (`checkin/slots`, a counter), posts its record under the slot
(`store.CheckIn`: signed, with a fresh challenge) and adds its ranks to `checkin/ranks`. Rank 0
waits until that count reaches the world size or `--timeout` passes, reads every slot's record
in batches, and answers once; the answer echoes each node's challenge (a replayed answer is
refused) and says which ranks never checked in, where their node said so, which leaders read it
(rank 0 waits for those), the job's redaction salt and where the process group's store is.
A leader still waiting for one of its ranks posts what it has when rank 0, at `--timeout`,
says it is closing (`CLOSING`, polled by such leaders only), so the rank is named with its
host however late the leader itself started. A
forged, replayed or malformed node record (or a rank's check-in its leader refused) is named in
the answer and ends every rank with exit 1, never believed. Counters cannot be signed: a forged
count only ends the wait early, and the ranks it claimed are named as missing.
Store operations: 4 a node to post, N/`store.BATCH` batched reads at rank 0 (N/8 records).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from lockstep.preflight import pg_store, report_json, verdict
from lockstep.preflight.lines import ranges
from lockstep.preflight.local import registry
from lockstep.preflight.store import CheckIn, Store

SLOTS, RANKS = "checkin/slots", "checkin/ranks"
CLOSING = "checkin/closing"  # rank 0's word to leaders still waiting for a rank: post now


def grace_s(timeout_s: float) -> float:
    """How long rank 0 waits, past `--timeout`, for the records of leaders still waiting for
    one of their ranks (they post what they have when told: `CLOSING`)."""
    return min(5.0, max(1.0, timeout_s / 4))


def node_record(
    host: str, leader: int, identities: list[dict], local_world: int, missing: list[int], refused
) -> dict:
    """What a leader posts for its node: `missing` local ranks never reached it."""
    return {
        "host": host,
        "leader": leader,
        "identities": identities,
        "local_world": local_world,
        "missing_local": missing,
        "refused": list(refused),
    }


def post_node(store: Store, record: dict) -> CheckIn:
    """A leader: claim a slot, post the node's record; the board its answer comes on."""
    slot = store.add(SLOTS) - 1
    board = CheckIn(store, "checkin")
    board.post(slot, record, who=record["host"])
    store.add(RANKS, len(record["identities"]))
    return board


def answer_nodes(
    board: CheckIn,
    world: int,
    timeout_s: float,
    launcher: str,
    backend: str,
    json_path,
    pg: dict | None = None,
    started: float | None = None,
) -> tuple[dict, dict[int, dict]]:
    """Rank 0: every node's record that came within `timeout_s` of `started` (monotonic; by
    default now), judged and answered; the answer and the identities by rank (the verdict
    reads them from here, not the store)."""
    store = board.store
    deadline = (time.monotonic() if started is None else started) + timeout_s
    if store.wait_count(RANKS, world, deadline) < world:
        store.put(CLOSING, 1)  # a node missing a rank: its leader posts what it has now
        store.wait_count(RANKS, world, time.monotonic() + grace_s(timeout_s))
    records = board.gather(store.count(SLOTS), time.monotonic(), is_node_record)
    identities: dict[int, dict] = {}
    for record in records.values():
        for ident in record["identities"]:
            if 0 <= ident["rank"] < world:
                identities.setdefault(ident["rank"], ident)
    missing = [r for r in range(world) if r not in identities]
    refused = [r.detail for r in board.refused.values()]
    refused += [f"on {rec['host']}: {line}" for rec in records.values() for line in rec["refused"]]
    answer = {
        "missing": missing,
        "where": where_missing(records.values()),
        "salt": secrets.token_hex(8),
        "blocked": None,
        "pg": pg,
        "leaders": sorted(rec["leader"] for rec in records.values()),
        "nonce": store.signer.nonce,  # the run's: the ranks behind a leader seal rows with it
    }
    if refused:  # forged or malformed check-ins: named, never believed
        answer["blocked"] = "preflight: " + " | ".join(refused)
    elif not missing:
        ordered = [identities[r] for r in range(world)]
        blocked = verdict.blocking(ordered, launcher, backend, registry.blocking(backend))
        if blocked:
            answer["blocked"] = blocked["line"]
            if json_path:
                report_json.write(blocked, Path(json_path))
    board.answer(answer)
    return answer, identities


def where_missing(records) -> str:
    """`on ls2: local rank 1 of 2 never reached its node's leader`, for each node that said."""
    return "; ".join(
        f"on {rec['host']}: local rank{'s' if len(rec['missing_local']) > 1 else ''} "
        f"{ranges(rec['missing_local'])} of {rec['local_world']} never reached its node's leader"
        for rec in records
        if rec["missing_local"]
    )


def missing_line(answer: dict, world: int, timeout_s: float) -> str:
    missing = answer["missing"]
    line = (
        f"rank{'s' if len(missing) > 1 else ''} {ranges(missing)} of {world} never checked in "
        f"within {timeout_s:g}s (not started, crashed, or launched with another "
        "MASTER_ADDR/PORT)"
    )
    return f"{line}; {answer['where']}" if answer.get("where") else line


def is_identity(value: object) -> bool:
    """A rank's check-in as `verdict` reads it (anything else is refused as malformed)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("rank"), int)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("checks"), list)
        and all(isinstance(c, dict) for c in value["checks"])
    )


def is_node_record(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("leader"), int)
        and isinstance(value.get("local_world"), int)
        and isinstance(value.get("identities"), list)
        and all(is_identity(i) for i in value["identities"])
        and _ints(value.get("missing_local"))
        and isinstance(value.get("refused"), list)
        and all(isinstance(x, str) for x in value["refused"])
    )


def is_answer(value: object) -> bool:
    return (
        isinstance(value, dict)
        and _ints(value.get("missing"))
        and isinstance(value.get("where"), str)
        and isinstance(value.get("salt"), str)
        and isinstance(value.get("blocked"), str | None)
        and _ints(value.get("leaders"))
        and isinstance(value.get("nonce"), str)
        and _is_pg_where(value.get("pg"))
    )


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) for x in value)


def _is_pg_where(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("host"), str)
        and pg_store.is_port(value.get("port"))
    )
