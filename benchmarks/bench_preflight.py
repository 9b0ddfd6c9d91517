"""Preflight wall time at 2 and 8 ranks on CPU, beside the cost of merely starting the ranks.

For each N, alternately, --repeat times: `lockstep preflight --nproc N` (embedded launch,
gloo), and `torchrun --standalone --nproc-per-node N` running `import torch` (what any torch
job pays to start N ranks). Medians. Rank 0's own `elapsed_s` (its time after `import torch`
until the verdict, from the JSON report) is the preflight's cost without the start-up.

    .venv/bin/python benchmarks/bench_preflight.py --nproc 2 8 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        for n in args.nproc:
            start_only, preflight, rank0 = [], [], []
            bare = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
            bare += ["--no-python", py, "-c", "import torch"]
            ours = [py, "-m", "lockstep", "preflight", "--nproc", str(n), "--json", str(report)]
            for _ in range(args.repeat):
                start_only.append(wall(bare, tmp))
                preflight.append(wall(ours, tmp))
                rank0.append(json.loads(report.read_text())["elapsed_s"])
            print(
                f"N={n} (median of {args.repeat}): lockstep preflight {statistics.median(preflight):.2f} s"
                f" wall; torchrun + import torch only {statistics.median(start_only):.2f} s; "
                f"rank 0 after import torch {statistics.median(rank0):.2f} s"
            )


if __name__ == "__main__":
    main()
