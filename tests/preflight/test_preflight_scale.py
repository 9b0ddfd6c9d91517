"""The scale benchmark's smallest size (issue 38), so it cannot rot: rank 0's real code against
64 synthetic ranks in a real libuv TCPStore, every value signed; rank 0 reads in batches; with
the hierarchical check-in, one record a node of 8 (node 0's leader on its real channel)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_preflight_scale.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_preflight_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_64_synthetic_ranks_pass_with_batched_reads():
    n, bench = 64, _bench()
    got = bench.run_size(n, procs=2, threads=2, cap_s=30.0)
    assert not got["capped"]
    assert got["exit_code"] == 0, got["problems"]
    flat_keys = {p[0]: p[3] for p in got["phases"]}["check-in: gather, answer"]
    # rank 0 read every check-in (N keys and more)...
    assert got["rank0_keys"] >= n
    # ...in batches: on main's code it made two calls a key (about 6 N operations)
    assert got["rank0_ops"] <= n // 2
    # the link stage's results came by collective: one look at its status board, no more
    links = {name: ops for name, _, ops, _ in got["phases"] if name.startswith("links:")}
    assert sum(links.values()) == 1, links
    # each synthetic rank posts once, its check-in as a node of one (5 operations: a slot, the
    # post, the rank count); before the link results came by collective, 6 more for its records
    assert got["ranks_ops"] == 5 * (n - 1)
    hier = bench.run_size(n, procs=2, threads=2, cap_s=30.0, hier=True)
    assert not hier["capped"] and hier["exit_code"] == 0, hier["problems"]
    phases = {p[0]: p for p in hier["phases"]}
    assert "node 0's leader: relay the answer" in phases
    # one record a node: rank 0 reads n/8 records (and the counts), not n check-ins
    assert phases["check-in: gather, answer"][3] < flat_keys / 4, (phases, flat_keys)
    # the other nodes' leaders post once for their 8 ranks (5 operations); no other rank posts
    assert hier["ranks_ops"] == 5 * (n // 8 - 1)
