"""The scale benchmark's smallest size (issue 38), so it cannot rot: rank 0's real code against
64 synthetic ranks in a real libuv TCPStore, every value signed; rank 0 reads in batches."""

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
    n = 64
    got = _bench().run_size(n, procs=2, threads=2, cap_s=30.0)
    assert not got["capped"]
    assert got["exit_code"] == 0, got["problems"]
    assert got["phases"][0][0] == "check-in: gather, answer"
    # rank 0 read every check-in (N keys and more)...
    assert got["rank0_keys"] >= n
    # ...in batches: on main's code it made two calls a key (about 6 N operations)
    assert got["rank0_ops"] <= n // 2
    # the link stage's results came by collective: one look at its status board, no more
    links = {name: ops for name, _, ops, _ in got["phases"] if name.startswith("links:")}
    assert sum(links.values()) == 1, links
    # each synthetic rank posts once (its check-in), three operations (before: links too, 9)
    assert got["ranks_ops"] == 3 * (n - 1)
