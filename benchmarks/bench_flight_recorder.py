"""The flight recorder's cost on a normal run: step time of the reference job with torch's
flight recorder off (TORCH_FR_BUFFER_SIZE=0) and on (2000 entries, torch's default and what
lockstep's launches use), side by side in one run.

    python benchmarks/bench_flight_recorder.py [--config smoke/cpu-ddp.toml] [--nproc 2] \
        [--steps 40] [--rounds 3]

Each round trains the reference job (`lockstep train CONFIG --nproc N`) once with the recorder
off and once on, in alternating order so that load from other processes hits both alike, and
reads each step's `step_time_s` from metrics.jsonl (the first 3 steps of a run dropped:
warm-up). Prints the median step time of each, and their ratio (goal: at most 2%). On a
shared, loaded machine that ratio is noisy; the recorder's own cost is not: `--micro` also
times all_reduces of 1024 floats on a one-rank gloo group with the recorder off and on
(alternating processes, the best of 7 x 3000 each) and prints the added time per collective, and how many collectives a
step of the reference job makes (counted from its own flight recorder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step_times(config: str, nproc: int, steps: int, buffer: str) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE=buffer)
        env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
        cmd = [sys.executable, "-m", "lockstep", "train", config, "--nproc", str(nproc),
               "--out", out, "--set", f"steps={steps}", "--set", f"checkpoint.every={steps * 10}",
               "--set", "logging.wandb=disabled"]  # fmt: skip
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        rows = [json.loads(ln) for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        return [r["step_time_s"] for r in rows if r.get("step", 0) > 3 and "step_time_s" in r]


WORKER = """
import time, torch, torch.distributed as dist
store = dist.HashStore()
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(1024)
for _ in range(500):
    dist.all_reduce(t)
best = float("inf")
for _ in range(7):
    start = time.perf_counter()
    for _ in range(3000):
        dist.all_reduce(t)
    best = min(best, (time.perf_counter() - start) / 3000)
print(best)
dist.destroy_process_group()
"""


def per_collective(buffer: str) -> float:
    """Seconds an all_reduce takes on a one-rank gloo group (no peer to wait for: what is
    left is the call's own path, the recorder's entry included); the best of 7 x 3000."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=buffer, OMP_NUM_THREADS="1")
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    out = subprocess.run([sys.executable, "-c", WORKER], check=True, env=env,
                         capture_output=True, text=True).stdout  # fmt: skip
    return float(out.split()[-1])


def collectives_per_step(config: str, nproc: int) -> float:
    """The reference job's collectives per step, from its flight recorder: two runs of 4 and
    8 steps (the difference removes set-up's collectives)."""
    counts = []
    for steps in (4, 8):
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, TORCH_FR_BUFFER_SIZE="20000")  # every rank dumps at its end
            cmd = [sys.executable, "-m", "lockstep", "train", config, "--nproc", str(nproc),
                   "--out", out, "--set", f"steps={steps}", "--set", "checkpoint.every=1000",
                   "--set", "logging.wandb=disabled"]  # fmt: skip
            subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
            from lockstep.forensics import dumps

            found, _ = dumps.load_dir(Path(out) / "flight-recorder")  # `lockstep train`'s
            counts.append(len(found[0].data["entries"]))
    return (counts[1] - counts[0]) / 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="smoke/cpu-ddp.toml")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro", action="store_true", help="also the cost per collective")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        this = {}
        for which in order:
            buffer = "0" if which == "off" else "2000"
            this[which] = step_times(args.config, args.nproc, args.steps, buffer)
            times[which] += this[which]
        a, b = statistics.median(this["off"]), statistics.median(this["on"])
        print(f"  round {r + 1}: off {a * 1e3:.2f} ms, on {b * 1e3:.2f} ms, on/off {b / a:.4f}",
              flush=True)  # fmt: skip
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"{args.config}, {args.nproc} ranks, {args.rounds} rounds x {args.steps} steps")
    print(f"  recorder off: median step {off * 1e3:.2f} ms ({len(times['off'])} steps)")
    print(f"  recorder on:  median step {on * 1e3:.2f} ms ({len(times['on'])} steps)")
    print(f"  on/off: {on / off:.4f} ({(on / off - 1) * 100:+.2f}%; goal at most +2%)")
    if args.micro:
        micro: dict[str, list[float]] = {"0": [], "2000": []}
        for r in range(args.rounds):
            for buffer in ("0", "2000") if r % 2 == 0 else ("2000", "0"):
                micro[buffer].append(per_collective(buffer))
        a, b = statistics.median(micro["0"]), statistics.median(micro["2000"])
        n = collectives_per_step(args.config, args.nproc)
        print(f"  all_reduce of 1024 floats, 1-rank gloo group: off {a * 1e6:.1f} us, on "
              f"{b * 1e6:.1f} us: {(b - a) * 1e6:+.1f} us a collective")  # fmt: skip
        print(f"  the reference job: {n:.0f} collectives a step: {n * (b - a) * 1e3:+.3f} ms "
              f"a step, {n * (b - a) / off * 100:+.2f}% of the median step")  # fmt: skip


if __name__ == "__main__":
    main()
