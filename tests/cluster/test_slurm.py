"""Slurm composed on a bed (`Slurm(bed)`): its daemons up on every node and down with it,
fast enough to start one per test module."""

from __future__ import annotations

import time

import pytest

from lockstep_testbed import Cluster, Slurm

pytestmark = pytest.mark.cluster


def test_set_up_and_tear_down_with_slurm_under_ten_seconds(slurm_available):
    start = time.monotonic()
    with Cluster(4) as bed, Slurm(bed) as slurm:
        up = time.monotonic() - start
        assert sorted(slurm.srun(["hostname"], timeout=30).stdout.split()) == bed.names
    total = time.monotonic() - start
    assert total < 10, f"bed with Slurm: up in {up:.1f}s, up+srun+down {total:.1f}s"
