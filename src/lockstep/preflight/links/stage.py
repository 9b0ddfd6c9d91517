"""The link stage on the ranks: point-to-point bandwidth and latency between node pairs.

Every rank runs `run_stage` after the collectives. The ranks learn the layout (host and local
rank of each rank, one all-gather of fixed size: `layout`), then walk the same schedule
(`schedule.schedule`): a first round within each node (local ranks 0-1, 2-3, ... at once on
every node), then rounds of disjoint node pairs. In a round, local rank i of one node pairs
with local rank i of the other (one NIC per GPU: each rail is measured; on CPU local rank 0
only, see `layout.stage_rails`), every pair at once; a barrier keeps rounds apart. A pair runs
every link measurement (`measure`: latency, then bandwidth with its CPU-starvation readings).

Timeouts: every op is bounded by the process group's timeout (`--timeout`). Each rank posts a
status in the store when it finishes or fails (the round and the peer it was waiting on); rank 0
waits at most the timeout plus a grace for all of them, and names the ranks that never posted
(a node that dropped out) instead of hanging. After the first pass its results go to rank 0,
which posts the rest (`schedule.second_plan`): the links that looked slow measured again
(none when nothing did), and beyond the full-matrix size the second pass (suspects paired with
good nodes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lockstep.preflight.lines import first_line
from lockstep.preflight.links import measure, schedule, section
from lockstep.preflight.links.layout import (
    Layout,
    layout_from_identities,
    plan_partner,
    stage_rails,
)
from lockstep.preflight.store import CheckIn, Store

CPU_BYTES = 4 << 20  # 32 Mbit: 500 tbf bursts of 64 kbit on the bed; 34 ms at 1 Gbit/s
GPU_BYTES = 256 << 20
FAULT_ENV = "LOCKSTEP_LINKS_FAULT"  # tests: "hang:<round>" makes this rank stop answering


class LinkStageFailed(RuntimeError):
    """This rank's link stage ended early (a peer failed or stalled); rank 0 names who."""


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
) -> Layout:
    """This rank's part of the link stage; its results and status go to the store."""
    nbytes = nbytes or stage_bytes(device)
    full = full_matrix or int(os.environ.get("LOCKSTEP_LINKS_FULL_MATRIX", schedule.FULL_MATRIX))
    rails = stage_rails(device)
    records: list[dict] = []

    def rounds(plan: list, offset: int) -> None:
        _run_rounds(dist, torch, device, lay, rank, plan, nbytes, offset, records, rails)

    try:
        n = len(lay.hosts)
        kind, first = schedule.schedule(n, full)
        all_rounds: list = [None, *first]  # None: the intra-node round
        rounds(all_rounds, 0)
        if n > 1:  # the confirmation rounds, and beyond the full matrix the second pass
            pass1 = CheckIn(store, "links/pass1")
            pass1.post(rank, records)
            plan = _second_plan(
                pass1, rank, lay, dist.get_world_size(), timeout_s, kind, min_link_gbps
            )
            rounds(plan, len(all_rounds))
        status = {"state": "done"}
    except LinkStageFailed as err:
        status = {"state": "failed", "why": str(err)}
    CheckIn(store, "links/end").post(rank, {"status": status, "records": records})
    return lay


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


def _second_plan(
    pass1: CheckIn,
    rank: int,
    lay: Layout,
    world: int,
    timeout_s: float,
    kind: str,
    min_link_gbps: float | None,
) -> list:
    """Rank 0 reads the first pass, posts the rest (`schedule.second_plan`: the slow links
    again, and beyond the full matrix the second pass); the others wait for it."""
    if rank == 0:
        answer = post_second_plan(pass1, lay, world, timeout_s, kind, min_link_gbps)
    else:
        answer = pass1.await_answer(timeout_s + 10, _is_plan)
        if answer is None:
            raise LinkStageFailed("rank 0 posted no second-pass plan")
    if "abort" in answer:
        raise LinkStageFailed(f"ranks {answer['abort']} sent no first-pass results")
    return [[tuple(p) for p in rnd] for rnd in answer["rounds"]]


def post_second_plan(
    pass1: CheckIn,
    lay: Layout,
    world: int,
    timeout_s: float,
    kind: str,
    min_link_gbps: float | None,
) -> dict:
    """Rank 0: read every rank's first-pass records, post the rest of the schedule (or an
    abort naming the ranks missing or refused)."""
    got = pass1.gather(world, time.monotonic() + timeout_s, _is_records)
    missing = [r for r in range(world) if r not in got]
    if pass1.refused:  # a forged or malformed record: every rank ends, rank 0 names it
        pass1.answer({"abort": sorted(pass1.refused)})
        raise next(iter(pass1.refused.values()))
    if missing:
        pass1.answer({"abort": missing})
        raise LinkStageFailed(f"ranks {missing} sent no first-pass results")
    plan = schedule.second_plan(
        len(lay.hosts),
        pair_links(lay, got)[0],
        sampled=kind == "sampled",
        min_link_gbps=min_link_gbps,
    )
    answer = {"rounds": plan}
    pass1.answer(answer)
    return answer


def pair_links(lay: Layout, records: dict[int, list[dict]]) -> tuple[list[dict], list[dict]]:
    """Per-rank records -> links between nodes (a, b, rail, gbps both ways, what the
    measurements carry: latency) and intra-node links."""
    by_pair: dict[tuple[int, int, int], dict] = {}
    for rank, recs in records.items():
        for rec in recs:
            peer = rec["peer"]
            lo, hi = min(rank, peer), max(rank, peer)
            key = (lo, hi, rec["round"])
            entry = by_pair.setdefault(key, {"ranks": [lo, hi], "intra": rec["intra"], "dirs": {}})
            entry["dirs"]["ab" if rank == lo else "ba"] = rec
    cross, intra = [], []
    for (lo, hi, rnd), entry in sorted(by_pair.items()):
        dirs = entry["dirs"]
        a, b = lay.node_of(lo), lay.node_of(hi)
        link = {
            "a": a,
            "b": b,
            "rail": lay.rail_of(lo),
            "ranks": [lo, hi],
            "round": rnd,
            "gbps": min(d["gbps_out"] for d in dirs.values()),
            "gbps_ab": dirs["ab"]["gbps_out"] if "ab" in dirs else None,
            "gbps_ba": dirs["ba"]["gbps_out"] if "ba" in dirs else None,
            # the slowest transfer either way: how far this measurement's repeats spread
            "gbps_low": min(d.get("gbps_low_out", d["gbps_out"]) for d in dirs.values()),
        }
        for key in measure.carried():
            link[key] = dirs["ab"].get(key) if "ab" in dirs else None
        for key in ("reps", "starved_reps", "extra_reps"):
            link[key] = sum(d.get(key, 0) for d in dirs.values())
        link["cpu_wait_known"] = any(d.get("cpu_wait_known") for d in dirs.values())
        # The link reads as its slower direction; that reading is in doubt only when it came
        # from a direction starved in every transfer (an unstarved one as slow settles it).
        trusted = [d["gbps_out"] for d in dirs.values() if not d.get("starved")]
        if not trusted or min(trusted) > link["gbps"]:
            link["starved"] = max(
                d["starved"]
                for d in dirs.values()
                if d.get("starved") and d["gbps_out"] == link["gbps"]
            )
        (intra if entry["intra"] else cross).append(link)
    return cross, intra


def collect(
    store: Store,
    lay: Layout | None,
    *,
    world: int,
    identities: list[dict],
    timeout_s: float,
    started: float,
    min_link_gbps: float | None,
    judge_intra: bool,
    nbytes: int,
) -> dict:
    """Rank 0, after its own part: wait for every rank's status (at most the timeout plus a
    grace from the stage's start), then judge what was measured (`section.assess`)."""
    deadline = started + timeout_s + max(2.0, 0.25 * timeout_s)
    board = CheckIn(store, "links/end")
    ended = board.gather(world, deadline, _is_end)
    if board.refused:  # a link figure another writer made is never judged
        raise next(iter(board.refused.values()))
    statuses = {r: e["status"] for r, e in ended.items()}
    records = {r: e["records"] for r, e in ended.items()}
    silent = [r for r in range(world) if r not in statuses]
    if lay is None:  # the layout exchange itself failed: hosts from the check-in
        lay = layout_from_identities(identities)
    cross, intra = pair_links(lay, records)
    failed = {r: s["why"] for r, s in statuses.items() if s["state"] != "done"}
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


def _is_records(value: object) -> bool:
    """A rank's link records as `pair_links` reads them (else refused as malformed)."""
    return isinstance(value, list) and all(
        isinstance(r, dict)
        and isinstance(r.get("peer"), int)
        and isinstance(r.get("round"), int)
        and isinstance(r.get("gbps_out"), int | float)
        for r in value
    )


def _is_end(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("status"), dict)
        and isinstance(value["status"].get("state"), str)
        and _is_records(value.get("records"))
    )


def _is_plan(value: object) -> bool:
    return isinstance(value, dict) and (
        isinstance(value.get("abort"), list) or isinstance(value.get("rounds"), list)
    )
