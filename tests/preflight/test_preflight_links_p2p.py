"""The link stage's transfers on two real gloo ranks: every one a batch (`batch_isend_irecv`,
which on NCCL runs on the world communicator), never a single send/recv (on NCCL a two-rank
communicator of its own per pair), with finite readings of the same shape as before."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from lockstep.preflight.links import measure

FIELDS = {
    "peer",
    "latency_us",
    "gbps_out",
    "gbps_low_out",
    "reps",
    "starved_reps",
    "extra_reps",
    "starved",
    "gbps_ceiling_out",
    "cpu_wait_known",
}


class OnlyBatched:
    """torch.distributed less its single send and recv; counts the batches."""

    def __init__(self):
        self.batches = 0

    def __getattr__(self, name):
        if name in ("send", "recv"):
            raise AttributeError(f"a single dist.{name}: a two-rank NCCL communicator per pair")
        return getattr(dist, name)

    def batch_isend_irecv(self, ops):
        self.batches += 1
        return dist.batch_isend_irecv(ops)


@pytest.mark.distributed(world_size=2)
def test_a_pair_measures_through_batches_only_with_finite_readings(rank):
    only = OnlyBatched()
    record = measure.measure_pair(only, torch, torch.device("cpu"), 1 - rank, rank == 0, 1 << 20)
    assert set(record) == FIELDS
    assert record["peer"] == 1 - rank
    assert only.batches > 0
    for field in ("latency_us", "gbps_out", "gbps_low_out"):
        assert math.isfinite(record[field]) and record[field] > 0, (field, record)
    assert record["gbps_low_out"] <= record["gbps_out"]
    assert record["reps"] >= 2
    # the most the link could be without the CPU waits: only for a direction always starved,
    # and never below what it read (None: waits as long as a transfer, no bound)
    ceiling = record["gbps_ceiling_out"]
    assert ceiling is None or (record["starved"] and ceiling >= record["gbps_out"]), record
