"""Preflight's time to a verdict on the 4-node cluster bed, beside a bare multi-node torchrun.

On a bed of 4 namespace nodes (lockstep_testbed, root), alternately, --repeat times, each a
fresh launch of one torchrun agent per node (--nnodes 4 --nproc-per-node 2, c10d rendezvous on
ls0), wall time until every agent has exited:

  bare       torchrun ... bare.py      (import torch, init gloo, one barrier: any job's cost)
  preflight  torchrun ... -m lockstep preflight [--no-links]
  own        lockstep preflight --nnodes 4 --node-rank K --nproc-per-node 2 --rdzv-endpoint
             (preflight's own multi-node launch: the check-in, then torchrun's launcher API)

Medians, and each against bare (the goal: preflight at most 1.1x).

    sudo .nox/locked-cpu/bin/python benchmarks/bench_cluster_preflight.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The bed is development only (testbed/, never in the wheel): from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from lockstep_testbed import Cluster
from lockstep_testbed.launch import start_torchrun

BARE = """import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def no_links(python: str) -> list[str]:
    helptext = subprocess.run(
        [python, "-m", "lockstep", "preflight", "--help"], capture_output=True, text=True
    ).stdout
    return ["--no-links"] if "--no-links" in helptext else []


def timed(bed: Cluster, procs: dict) -> float:
    start = time.perf_counter()
    results = bed.wait_all(procs, timeout=300)
    took = time.perf_counter() - start
    bad = {n: r.returncode for n, r in results.items() if r.returncode}
    if bad:
        tail = {n: (r.stdout + r.stderr)[-1500:] for n, r in results.items() if r.returncode}
        raise SystemExit(f"failed: {bad}\n{tail}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"bare": [], "preflight": [], "own": []}
    with Cluster(args.nodes, env={"NO_COLOR": "1"}) as bed:
        (bed.shared / "bare.py").write_text(BARE)
        extra = no_links(bed.python)
        n = args.nproc_per_node
        port = 29400
        for i in range(args.repeat):
            for what in times:
                port += 2  # a fresh rendezvous (and check-in) port per launch
                start = time.perf_counter()
                if what == "bare":
                    procs = start_torchrun(
                        bed, [str(bed.shared / "bare.py")], nproc_per_node=n, port=port
                    )
                elif what == "preflight":
                    argv = ["-m", "lockstep", "preflight", "--timeout", "120", *extra]
                    procs = start_torchrun(bed, argv, nproc_per_node=n, port=port)
                else:
                    procs = {
                        k: bed.popen(
                            k,
                            [
                                *(bed.python, "-m", "lockstep", "preflight", "--timeout", "120"),
                                *("--nnodes", str(args.nodes), "--node-rank", str(k)),
                                *("--nproc-per-node", str(n), *extra),
                                *("--rdzv-endpoint", f"{bed.hostname(0)}:{port}"),
                            ],
                            stderr=subprocess.PIPE,
                        )
                        for k in range(args.nodes)
                    }
                timed(bed, procs)
                took = time.perf_counter() - start
                times[what].append(took)
                print(f"round {i + 1}: {what:9s} {took:6.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    world = args.nodes * args.nproc_per_node
    print(f"\n{args.nodes} nodes x {args.nproc_per_node} ranks ({world}), median of {args.repeat}:")
    print(f"  bare torchrun (init gloo + barrier)       {med['bare']:6.2f} s")
    print(
        f"  torchrun -m lockstep preflight {' '.join(extra):9s} {med['preflight']:6.2f} s"
        f"  {med['preflight'] / med['bare']:.2f}x"
    )
    print(
        f"  lockstep preflight --nnodes (check-in)    {med['own']:6.2f} s"
        f"  {med['own'] / med['bare']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
