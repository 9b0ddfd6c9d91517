"""After a collective failed: which ranks stopped answering, diagnosed once, at rank 0.

Every rank that still reaches the store says so (`report_in`: a signed `abort/R` and one count,
two operations). Rank 0 (`diagnose`) waits up to `--timeout` for the count to reach the world
size (each rank gives up on its own collective's timeout; the count is polled, a few operations
a second whatever the size), finds the ranks that said nothing with batched checks (`BATCH` keys
in one operation, a batch bisected only where one is missing), reads the others' posts in
batches (a forged one is not believed: that rank counts as silent), names the silent ranks with
the hosts and addresses of their check-ins and posts that once. Every other rank reads it
(`await_diagnosis`) while rank 0's heartbeat goes on (`heartbeat.Watch`), so all exit with the
same names. Store operations: O(1) a rank, O(N / BATCH + k log BATCH) at rank 0 for k silent;
before (issue 38) every rank polled the count and then checked all N keys, N^2 in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lockstep.preflight.heartbeat import Heartbeat, Watch
from lockstep.preflight.lines import ranges
from lockstep.preflight.store import BATCH, Refused, Store

DIAGNOSIS = "abort/diagnosis"
POLL_S = 0.2  # rank 0's poll of the count


def report_in(store: Store, rank: int) -> None:
    """This rank still reaches the store."""
    store.put(f"abort/{rank}", 1)
    store.add("abort/count")


def diagnose(
    store: Store,
    world: int,
    identity: Callable[[int], dict],
    timeout_s: float,
    beat: Heartbeat | None = None,
) -> str | None:
    """Rank 0: `ranks 4-5 on ls2 (10.0.0.3)` (None: every rank answered), posted for the
    others; then stay (serving the store) until they read it, at most `timeout_s`."""
    store.wait_count("abort/count", world, time.monotonic() + timeout_s, every=POLL_S)
    silent = sorted(silent_ranks(store, world))
    text = where(silent, identity) if silent else None
    store.put(DIAGNOSIS, {"silent": text})
    if beat is not None:
        beat.posted(DIAGNOSIS)
    store.wait_count("abort/read", world - 1 - len(silent), time.monotonic() + timeout_s)
    return text


def await_diagnosis(store: Store, watch: Watch, within_s: float) -> str | None:
    """Every other rank: rank 0's diagnosis; `RankTimeout` naming rank 0 when its heartbeat
    stops, None when it did not come within `within_s`."""
    if not watch.wait_for(DIAGNOSIS, within_s, "the failure diagnosis"):
        return None
    got = store.get(DIAGNOSIS, _is_diagnosis)
    store.add("abort/read")
    return got["silent"]


def silent_ranks(store: Store, world: int) -> list[int]:
    """The ranks of 0..world-1 without a believed `abort/R`."""
    out: list[int] = []
    for start in range(0, world, BATCH):
        _scan(store, start, min(start + BATCH, world), out)
    return out


def _scan(store: Store, lo: int, hi: int, out: list[int]) -> None:
    keys = [f"abort/{r}" for r in range(lo, hi)]
    if store.has(*keys):
        try:
            store.get_many(keys, _is_one)
            return
        except Refused:  # some forged: read one by one, the forged ones silent
            pass
        if hi - lo == 1:
            out.append(lo)
            return
    elif hi - lo == 1:
        out.append(lo)
        return
    mid = (lo + hi) // 2
    _scan(store, lo, mid, out)
    _scan(store, mid, hi, out)


def where(silent: list[int], identity: Callable[[int], dict]) -> str:
    """`ranks 4-5 on ls2 (10.0.0.3); rank 7 on ls3`, from the check-in's identities."""
    hosts: dict[str, list[int]] = {}
    for r in silent:
        ident = identity(r)
        place = ident["host"] + (f" ({ident['address']})" if ident.get("address") else "")
        hosts.setdefault(place, []).append(r)
    return "; ".join(
        f"rank{'s' if len(rs) > 1 else ''} {ranges(rs)} on {place}" for place, rs in hosts.items()
    )


def _is_one(value: object) -> bool:
    return value == 1


def _is_diagnosis(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("silent"), str | None)
