"""The link stage on the ranks: point-to-point bandwidth and latency between node pairs.

Every rank runs `run_stage` after the collectives. The ranks learn the layout (host and local
rank of each rank, one all-gather of fixed size: `layout`), then walk the same schedule
(`schedule.schedule`): a first round within each node (local ranks 0-1, 2-3, ... at once on
every node), then rounds of disjoint node pairs. In a round, local rank i of one node pairs
with local rank i of the other (one NIC per GPU: each rail is measured; on CPU local rank 0
only, see `layout.stage_rails`), every pair at once; a barrier keeps rounds apart. A pair runs
every link measurement (`measure`: latency, then bandwidth with its CPU-starvation readings).

Results: each pass (the first: the intra-node round and the schedule's rounds; the second: the
rest) ends with one gather of a fixed-size sealed row per rank to rank 0 (`results`), which
opens them and broadcasts the next pass's rounds (`schedule.second_plan`: the links that looked
slow measured again, none when nothing did, and beyond the full-matrix size the second pass:
suspects paired with good nodes), or the end. Nothing of a healthy stage goes through the store.

Timeouts: every op is bounded by the process group's timeout (`--timeout`). A rank whose stage
ends early (a peer failed or stalled: every other rank then fails at its next collective too)
posts a small status in the store, the round and the peer it was waiting on; rank 0 then waits
at most the timeout plus a grace for the others' and names the ranks that never posted (a node
that dropped out) instead of hanging.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.preflight.lines import first_line
from lockstep.preflight.links import measure, results, schedule, section
from lockstep.preflight.links.bulk import gc_paused
from lockstep.preflight.links.layout import (
    Layout,
    layout_from_identities,
    plan_partner,
    stage_rails,
)
from lockstep.preflight.links.pairing import Pairing
from lockstep.preflight.store import CheckIn, Store

CPU_BYTES = 4 << 20  # 32 Mbit: 500 tbf bursts of 64 kbit on the bed; 34 ms at 1 Gbit/s
GPU_BYTES = 256 << 20
BOARD = "links/end"  # the statuses of the ranks whose stage ended early
END_GRACE_S = 2.0  # rank 0 ended early: how long the others' statuses may follow its own
FAULT_ENV = "LOCKSTEP_LINKS_FAULT"  # tests: "hang:<round>" makes this rank stop answering


class LinkStageFailed(RuntimeError):
    """This rank's link stage ended early (a peer failed or stalled); rank 0 names who."""


@dataclass
class Outcome:
    """This rank's end of the stage: the layout; on rank 0 every rank's records gathered, by
    rank; `failed`: why this rank's stage ended early (None: every rank's results arrived),
    `ended`: when (monotonic); `pairing`: rank 0's links of the first pass, built once
    (`pairing.Pairing`)."""

    lay: Layout
    records: dict[int, list[dict]] = field(default_factory=dict)
    failed: str | None = None
    ended: float = 0.0
    pairing: Pairing | None = None


def run_stage(
    dist,
    torch,
    device,
    store: Store,
    *,
    rank: int,
    lay: Layout,
    timeout_s: float,
    nbytes: int | None = None,
    full_matrix: int | None = None,
    min_link_gbps: float | None = None,
) -> Outcome:
    """This rank's part of the link stage: its results gathered to rank 0 after each pass;
    where the stage ends early, its status goes to the store."""
    nbytes = nbytes or stage_bytes(device)
    full = full_matrix or int(os.environ.get("LOCKSTEP_LINKS_FULL_MATRIX", schedule.FULL_MATRIX))
    rails = stage_rails(device)
    world = dist.get_world_size()
    ex = results.Exchange(dist, torch, device, store.signer, rank, world)
    out = Outcome(lay, pairing=Pairing(lay))
    try:
        n = len(lay.hosts)
        kind, first = schedule.schedule(n, full)
        sampled = kind == "sampled"
        first_rounds: list = [None, *first]  # None: the intra-node round
        mine: list[dict] = []
        _run_rounds(dist, torch, device, lay, rank, first_rounds, nbytes, 0, mine, rails)

        def second(records: dict) -> list:
            if n < 2:
                return []
            return second_plan(
                lay, records, sampled=sampled, min_link_gbps=min_link_gbps, pairing=out.pairing
            )

        size = results.plan_ints(n, schedule.plan_rounds(n, sampled=sampled))
        done = len(first_rounds)
        plan = ex.close("links/pass1", mine, range(done), second, size)
        if plan.rounds:  # the confirmation rounds, and beyond the full matrix the second pass
            mine = []
            _run_rounds(dist, torch, device, lay, rank, plan.rounds, nbytes, done, mine, rails)
            rest = range(done, done + len(plan.rounds))
            ex.close("links/pass2", mine, rest, lambda _: [], results.plan_ints(n, 0))
    except (LinkStageFailed, results.Failed) as err:
        out.failed, out.ended = str(err), time.monotonic()
        CheckIn(store, BOARD).post(rank, {"state": "failed", "why": str(err)})
    out.records = ex.records
    return out


def _run_rounds(dist, torch, device, lay, rank, rounds, nbytes, offset, records, rails) -> None:
    hang_at = _fault_round()
    for k, pairs in enumerate(rounds):
        index = offset + k
        if hang_at is not None and index >= hang_at:
            while True:  # a node that stops answering mid-stage (tests only)
                time.sleep(3600)
        peer = plan_partner(lay, rank, pairs, rails)
        if peer is not None:
            try:
                got = measure.measure_pair(dist, torch, device, peer, rank < peer, nbytes)
            except Exception as err:
                raise LinkStageFailed(
                    f"round {index}: waiting on rank {peer}: {first_line(err, 300)}"
                ) from None
            got["round"] = index
            got["intra"] = pairs is None
            records.append(got)
        try:
            dist.barrier()
        except Exception as err:
            raise LinkStageFailed(f"round {index}: barrier: {first_line(err, 300)}") from None


def _fault_round() -> int | None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec.startswith("hang:"):
        return int(spec.split(":", 1)[1])
    return None


def second_plan(
    lay: Layout,
    records: dict[int, list[dict]],
    *,
    sampled: bool,
    min_link_gbps: float | None,
    pairing: Pairing | None = None,
) -> list:
    """Rank 0, the first pass's records in: the rest of the schedule (`schedule.second_plan`);
    `pairing`: where the links are kept for the end (`collect`)."""
    cross = (pairing or Pairing(lay)).links(records)[0]
    return schedule.second_plan(len(lay.hosts), cross, sampled=sampled, min_link_gbps=min_link_gbps)


def collect(
    store: Store,
    outcome: Outcome | None,
    *,
    world: int,
    identities: list[dict],
    timeout_s: float,
    started: float,
    min_link_gbps: float | None,
    judge_intra: bool,
    nbytes: int,
) -> dict:
    """Rank 0, after its own part: judge what was measured (`section.assess`). Where the
    stage ended early, first every rank's status from the store (at most the timeout plus a
    grace from the stage's start, and a grace after rank 0's own end); where it did not, the
    board is read only when something was posted there (one operation)."""
    board = CheckIn(store, BOARD)
    if outcome is not None and outcome.failed is None:
        statuses = {}  # every rank done: only a rank that posted says otherwise
        if board.count():  # no rank posts on a healthy stage: a post is read, a forgery refused
            statuses = board.gather(world, time.monotonic(), _is_status)
        done = True
    else:
        deadline = started + timeout_s + max(2.0, 0.25 * timeout_s)
        if outcome is not None:  # the others fail at the same collective: a grace for them
            deadline = max(deadline, outcome.ended + END_GRACE_S)
        statuses = board.gather(world, deadline, _is_status)
        done = False
    if board.refused:  # a status another writer made is never believed
        raise next(iter(board.refused.values()))
    silent = [] if done else [r for r in range(world) if r not in statuses]
    # the layout exchange itself failed: hosts from the check-in
    lay = outcome.lay if outcome is not None else layout_from_identities(identities)
    failed = {r: s["why"] for r, s in statuses.items() if s["state"] != "done"}
    with gc_paused():  # the links paired and judged (`bulk`)
        # the first pass's links, built already where the stage kept them
        pairing = (outcome.pairing if outcome is not None else None) or Pairing(lay)
        cross, intra = pairing.links(outcome.records if outcome is not None else {})
        return section.assess(
            hosts=lay.hosts,
            ranks=lay.ranks,
            local=lay.local,
            cross=cross,
            intra=intra,
            silent=silent,
            failed=failed,
            min_link_gbps=min_link_gbps,
            judge_intra=judge_intra,
            timeout_s=timeout_s,
            nbytes=nbytes,
            elapsed_s=time.monotonic() - started,
        )


def write_outputs(links_section: dict, *, exclude_out: str | None, plot: str | None) -> None:
    """Rank 0: `--exclude-out FILE` (a Slurm host list, empty when nothing is to be left out)
    and `--plot DIR` (links.png, the heatmap)."""
    if exclude_out:
        text = links_section["exclude_hostlist"] + ("\n" if links_section["exclude"] else "")
        Path(exclude_out).write_text(text)
    if plot:
        from lockstep.preflight.links.plot import heatmap

        heatmap(links_section, Path(plot))


def stage_bytes(device) -> int:
    return int(
        os.environ.get("LOCKSTEP_LINK_BYTES", GPU_BYTES if device.type == "cuda" else CPU_BYTES)
    )


def _is_status(value: object) -> bool:
    """A rank's status on the board: its stage ended early, and why (else refused)."""
    return (
        isinstance(value, dict)
        and value.get("state") == "failed"
        and isinstance(value.get("why"), str)
    )
