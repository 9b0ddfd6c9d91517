"""Latency: half the median round trip of a small message, after one warm-up round trip
(NCCL connects the pair's channels within the world communicator there)."""

from __future__ import annotations

import statistics
import time

from lockstep.preflight.links.pair import Pair

LAT_ITERS = 8


def latency(pair: Pair) -> dict:
    out, back = pair.floats(2), pair.floats(2)

    def ping() -> None:
        if pair.first:
            pair.send_then_recv(out, back)
        else:
            pair.recv(back)
            pair.send(back)
        pair.sync()

    ping()  # warm-up
    rtts = []
    for _ in range(LAT_ITERS):
        t0 = time.perf_counter()
        ping()
        rtts.append(time.perf_counter() - t0)
    return {"latency_us": round(statistics.median(rtts) / 2 * 1e6, 1)}
