"""Bandwidth: each side sends `nbytes` to the other, timed until a two-float ack (the sender's
clock; the best of `REPS`), and how many of those transfers were CPU-starved.

A rank waiting for a CPU moves data at the CPU's pace, not the link's. Each side reads its
process's run-queue wait around every transfer (`run_delays`: the sum over its threads of
/proc/self/task/*/schedstat's run_delay); the receiver sends its wait right after the ack, in
the same two-float tensor (a message of its own, so that no /proc read falls in the timed
span), and the sender knows both ends'. A transfer whose ends together waited more than
`stats.STARVED_FRACTION` of it is starved; while every transfer of a direction was, the sender
asks for another (a one-float message says whether one comes), up to `EXTRA_REPS` more. A
direction starved in every transfer is recorded as such, with the most its link could be
(`gbps_ceiling_out`: starvation slows a transfer by at most the time waited, so a transfer
less its ends' waits took no longer than the link alone would have; the best of those bounds).
The verdict leaves such a direction unjudged rather than calling the link slow, unless even
that ceiling is clearly slow (`stats.judgeable`): waits that overlapped a slow link's own pace
(a tc-shaped link wakes its receiver for every burst) cannot explain a reading that far down.
Where /proc is unreadable the wait is unknown: not starved.
"""

from __future__ import annotations

import math
import os
import time

from lockstep.preflight.links.pair import Pair
from lockstep.preflight.links.stats import STARVED_FRACTION

REPS = 2
EXTRA_REPS = 2  # more transfers while every one of a direction was starved: 4 at most
STARVED_PAUSE_S = 0.02  # the sender's pause before each of those: a burst of load may pass


def bandwidth(pair: Pair) -> dict:
    """This rank's send bandwidth to its peer (`gbps_out`) with its transfers' CPU waits
    (`reps`, `starved_reps`, `extra_reps`, `starved`, `gbps_ceiling_out`, `cpu_wait_known`).
    Both directions run, the lower rank sending first; each side keeps the direction it sent."""
    buffers = _Buffers(pair)
    first_out = _one_way(pair, buffers, pair.first)
    second_out = _one_way(pair, buffers, not pair.first)
    sent = first_out if pair.first else second_out
    return {
        "gbps_out": round(pair.nbytes * 8 / sent["seconds"] / 1e9, 4),
        "gbps_low_out": round(pair.nbytes * 8 / sent["slowest"] / 1e9, 4),
        "gbps_ceiling_out": _gbps(pair.nbytes, sent["unstarved"]) if sent["starved"] else None,
        **{k: v for k, v in sent.items() if k not in ("seconds", "slowest", "unstarved")},
    }


def _gbps(nbytes: int, seconds: float) -> float | None:
    """`nbytes` in `seconds` as Gb/s; None for no time left (no bound)."""
    return round(nbytes * 8 / seconds / 1e9, 4) if seconds > 0 else None


class _Buffers:
    def __init__(self, pair: Pair):
        self.small = pair.floats(2)  # the ack, then the receiver's CPU wait
        self.flag = pair.floats(1)  # one more transfer or not
        self.big = pair.floats(max(1, pair.nbytes // 4), 1.0)


def _transfer(pair: Pair, buf: _Buffers, sending: bool) -> tuple[float, float | None]:
    """One timed transfer, `big` then the ack: on the sender (seconds, the fraction of them
    both ends waited for a CPU, None where neither could tell); (0, None) on the receiver.
    Each side reads its wait around its part; /proc is read outside the timed span (about
    15 us a thread: a GPU rank's dozens of threads would skew a fast link's reading), so the
    receiver's wait follows the ack in a message of its own."""
    small = buf.small
    pair.sync()
    before = run_delays()
    t0 = time.perf_counter()
    if sending:
        pair.send_then_recv(buf.big, small)
    else:
        pair.recv(buf.big)
        pair.send(small)
    pair.sync()
    elapsed = time.perf_counter() - t0
    waited = waited_s(before, run_delays())
    if not sending:
        small[0] = -1.0 if waited is None else waited
        pair.send(small)
        pair.sync()
        return 0.0, None
    pair.recv(small)
    pair.sync()
    theirs = float(small[0].item())
    if waited is None and theirs < 0:
        return elapsed, None
    return elapsed, ((waited or 0.0) + max(theirs, 0.0)) / elapsed


def _one_way(pair: Pair, buf: _Buffers, sending: bool) -> dict:
    """REPS transfers, and up to EXTRA_REPS more while every one was starved; the sender
    decides and says so (`flag`) after each from the REPS-th on. The best of them all:
    starvation only slows a transfer, so a starved one faster than the rest still bounds the
    link's speed from below; `starved` only when every one was. The slowest too (`slowest`):
    how far the repeats spread, so that a noisy reading is not judged (`verdict`). And the
    least time a starved transfer took less its ends' CPU waits (`unstarved`, 0 where they
    were as long as it): the link alone would have taken at least that long."""
    best, slowest, reps, starved, least, known = math.inf, 0.0, 0, 0, math.inf, False
    unstarved = math.inf
    while True:
        if sending and reps >= REPS:
            time.sleep(STARVED_PAUSE_S)
        elapsed, frac = _transfer(pair, buf, sending)
        reps += 1
        if sending:
            best = min(best, elapsed)
            slowest = max(slowest, elapsed)
            known = known or frac is not None
            if frac is not None and frac > STARVED_FRACTION:
                starved += 1
                least = min(least, frac)
                unstarved = min(unstarved, max(0.0, elapsed * (1 - frac)))
        if reps < REPS:
            continue
        if sending:
            more = starved == reps and reps < REPS + EXTRA_REPS
            buf.flag[0] = 1.0 if more else 0.0
            pair.send(buf.flag)
        else:
            pair.recv(buf.flag)
        pair.sync()
        if not float(buf.flag[0].item()):
            break
    return {
        "seconds": best,
        "slowest": slowest,
        "unstarved": unstarved,
        "reps": reps,
        "starved_reps": starved,
        "extra_reps": reps - REPS,
        "starved": round(least, 3) if starved == reps else None,
        "cpu_wait_known": known,
    }


def run_delays() -> dict[str, int] | None:
    """This process's run-queue wait so far, per thread (ns): the second field of
    /proc/self/task/<tid>/schedstat (run_delay: time runnable but waiting for a CPU). None
    where unreadable (no /proc, no schedstat)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out or None


def waited_s(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """Seconds this process's threads waited for a CPU between two `run_delays` (a thread
    started in between counts from its start); None where either is unknown."""
    if before is None or after is None:
        return None
    return sum(max(0, ns - before.get(tid, 0)) for tid, ns in after.items()) / 1e9
