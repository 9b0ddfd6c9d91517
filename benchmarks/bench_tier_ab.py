"""The CPU tier of two trees side by side, A B A B: wall and busy core-seconds of each run.

    .nox/locked-cpu/bin/python benchmarks/bench_tier_ab.py BASE HEAD [--rounds 2]

BASE and HEAD are checkouts (e.g. `git worktree add /tmp/base main`); each runs its own tests
on its own `src/` with this venv's pytest (`-n 3`, one OpenMP thread, as `nox -s tests`).
Each tree runs only the tests both have (by node id, from `--collect-only`): HEAD's new tests
and BASE's renamed or removed ones are left out; the new tests' own cost is measured apart
with `--only-new` (HEAD's new tests alone, one run). Busy core-seconds are `/proc/stat`'s first
line before and after: the whole machine, so run it on an otherwise idle one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def busy() -> float:
    """Core-seconds the machine has spent not idle (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}


def collected(tree: Path) -> set[str]:
    out = subprocess.run([*PYTEST, "--collect-only", "-n", "0"], cwd=tree, env=env(tree),
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {line for line in out.splitlines() if "::" in line}


def run(tree: Path, args: list[str]) -> tuple[float, float, str]:
    before, start = busy(), time.monotonic()
    proc = subprocess.run([*PYTEST, "-n", "3", *args], cwd=tree, env=env(tree),
                          capture_output=True, text=True)  # fmt: skip
    wall, cpu = time.monotonic() - start, busy() - before
    return wall, cpu, (proc.stdout.strip().splitlines() or ["(no output)"])[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only-new", action="store_true", help="HEAD's new tests alone, once")
    a = p.parse_args()
    base, head = collected(a.base), collected(a.head)
    new, gone = sorted(head - base), sorted(base - head)
    print(f"{len(new)} tests in HEAD only, {len(gone)} in BASE only: left out of the runs")
    if a.only_new:
        wall, cpu, last = run(a.head, new)
        print(f"HEAD's new tests alone: {wall:.1f} s wall, {cpu:.1f} busy core-s ({last})")
        return

    def leave_out(nodes):
        return [arg for node in nodes for arg in ("--deselect", node)]

    rows: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for i in range(1, a.rounds + 1):
        for label, tree, extra in (("A", a.base, leave_out(gone)), ("B", a.head, leave_out(new))):
            wall, cpu, last = run(tree, extra)
            rows[label].append((wall, cpu))
            load = os.getloadavg()[0]
            print(f"{label}{i} {time.strftime('%H:%M:%S')} {wall:7.1f} s wall {cpu:7.1f} busy "
                  f"core-s (load {load:.1f}) {last}", flush=True)  # fmt: skip
    med = {k: statistics.median(c for _, c in v) for k, v in rows.items()}
    spread = max(c for _, c in rows["A"]) - min(c for _, c in rows["A"])
    print(f"median busy core-s: A {med['A']:.1f}, B {med['B']:.1f}, B/A {med['B'] / med['A']:.3f}"
          f"; A/A spread {spread:.1f} ({spread / med['A']:.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
