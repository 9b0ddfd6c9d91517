"""Every link measurement, in the order a pair runs them: a new one is a module of
`lockstep.preflight.links` and a row of `MEASUREMENTS`, or `register()` from outside (in every
rank's process: both ranks of a pair must run the same measurements in the same order).

A measurement is `run(pair) -> dict`, the fields it adds to this rank's record of the pair
(`pair.Pair`: the peer, the process group, the device). Each link of the report carries the
bandwidth of both directions (`gbps`, judged by `verdict`) and, from the lower rank's record,
the fields a row names in `carry` (latency's `latency_us`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockstep.preflight.links.bandwidth import bandwidth
from lockstep.preflight.links.latency import latency
from lockstep.preflight.links.pair import Pair
from lockstep.registry import Registry


@dataclass(frozen=True)
class LinkMeasurement:
    name: str
    run: Callable[[Pair], dict]
    carry: tuple[str, ...] = ()  # fields each link of the report takes from the lower rank


MEASUREMENTS: Registry[LinkMeasurement] = Registry(
    "link measurement",
    [
        LinkMeasurement("latency", latency, carry=("latency_us",)),  # first: its warm-up
        LinkMeasurement("bandwidth", bandwidth),
    ],
)
register = MEASUREMENTS.register


def carried() -> tuple[str, ...]:
    """The fields a link takes from its lower rank's record."""
    return tuple(field for m in MEASUREMENTS.values() for field in m.carry)


def measure_pair(dist, torch, device, peer: int, first: bool, nbytes: int) -> dict:
    """This rank's record of the pair with `peer`: every measurement's fields. Both sides call
    it; `first`: this rank is the lower one."""
    pair = Pair(dist=dist, torch=torch, device=device, peer=peer, first=first, nbytes=nbytes)
    record: dict = {"peer": peer}
    for m in MEASUREMENTS.values():
        record.update(m.run(pair))
    return record
