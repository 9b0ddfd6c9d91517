"""Per-test overhead of a trivial 2-rank test: the warm pool against fresh ranks per test.

Writes one test file of trivial `@pytest.mark.distributed(world_size=2)` tests (an all_reduce
and an assert) and runs it in two real pytest sessions, one after the other in this run: with
the warm pool (the default) and with `lockstep_reuse_pool = false`, which starts new ranks for
every test (cold). Per-test times come from pytest's JUnit XML (setup + call + teardown).

    .venv/bin/python benchmarks/bench_pool.py [--warm-tests 30] [--cold-tests 5]

Goal on the 2-core CI machine: at most 0.3 s per test warm, at least 10x faster than cold.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

TEST = """
import pytest, torch, torch.distributed as dist


@pytest.mark.parametrize("i", range({n}))
@pytest.mark.distributed(world_size=2)
def test_trivial(rank, i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""


def run_session(workdir: Path, tests: int, reuse: bool) -> tuple[list[float], float]:
    """Per-test times (in run order) and the session's wall time."""
    (workdir / "test_bench.py").write_text(TEST.format(n=tests))
    report = workdir / f"report-{reuse}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_bench.py"]
    cmd += ["-o", f"lockstep_reuse_pool={str(reuse).lower()}", f"--junitxml={report}"]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    times = [float(case.get("time")) for case in ET.parse(report).iter("testcase")]
    if len(times) != tests:
        raise SystemExit(f"expected {tests} test results, got {len(times)}")
    return times, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-tests", type=int, default=30)
    parser.add_argument("--cold-tests", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lockstep-bench-") as tmp:
        warm, warm_wall = run_session(Path(tmp), args.warm_tests, reuse=True)
        cold, cold_wall = run_session(Path(tmp), args.cold_tests, reuse=False)
    warm_steady = statistics.median(warm[1:])  # the first test also starts the pool
    warm_amortized = sum(warm) / len(warm)
    cold_median = statistics.median(cold)
    print(f"trivial 2-rank tests, gloo on CPU, python {sys.version.split()[0]}")
    print(f"warm pool: {args.warm_tests} tests in {warm_wall:.2f} s wall")
    print(f"  first test (starts the pool): {warm[0]:.3f} s")
    print(f"  per test, median of the rest:  {warm_steady:.3f} s")
    print(f"  per test, mean with the start: {warm_amortized:.3f} s")
    print(f"cold (fresh ranks per test): {args.cold_tests} tests in {cold_wall:.2f} s wall")
    print(f"  per test, median:              {cold_median:.3f} s")
    print(f"ratio cold/warm (median per test): {cold_median / warm_steady:.0f}x")
    print(f"ratio cold/warm (with the pool start): {cold_median / warm_amortized:.1f}x")


if __name__ == "__main__":
    main()
