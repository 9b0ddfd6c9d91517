"""Latency: half the median round trip of a small message, after one warm-up round trip
(NCCL builds the pair's communicator there)."""

from __future__ import annotations

import statistics
import time

from lockstep.preflight.links.pair import Pair

LAT_ITERS = 8


def latency(pair: Pair) -> dict:
    small = pair.floats(2)

    def ping() -> None:
        if pair.first:
            pair.dist.send(small, pair.peer)
            pair.dist.recv(small, pair.peer)
        else:
            pair.dist.recv(small, pair.peer)
            pair.dist.send(small, pair.peer)
        pair.sync()

    ping()  # warm-up
    rtts = []
    for _ in range(LAT_ITERS):
        t0 = time.perf_counter()
        ping()
        rtts.append(time.perf_counter() - t0)
    return {"latency_us": round(statistics.median(rtts) / 2 * 1e6, 1)}
