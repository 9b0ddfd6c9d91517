"""Benchmark of the regression gates.

1. Time to compare a 100,000-step golden (read the file, compare every step): goal < 1 s.
2. The performance A/B gate on this (noisy, shared) machine, side by side with a single
   stored baseline and a fixed 5% rule (what pytest-benchmark and github-action-benchmark do),
   on the same runs: A/A trials (head identical to base) count false alarms (goal: at most 1
   in 20), trials with a 10% slower head count detections (goal: at least 19 in 20).

The workload is a script speaking lockstep's protocol in a git repository of its own: each
step runs K matmuls of 256x256 (K = 80 at base, about 40 ms; 88 in the slower head: 10% more
work) on one thread and logs its own step time. Each trial runs `lockstep gate ab`'s alternation (base, head, head, base, ...)
for --rounds rounds; the stored-baseline rule compares each trial's first head run with one
base run recorded at the start of the benchmark.

    python benchmarks/bench_gate.py --trials 20 --rounds 5
    python benchmarks/bench_gate.py --trials 20 --rounds 5 --load 1   # a busy neighbour

`--load N` starts N processes that, after the stored baseline is taken, keep a core busy in
bursts of random length (0.5 to 3 s busy, 0 to 2 s idle), as other jobs on a shared runner do.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lockstep.gate import ab, golden
from lockstep.gate.compare import compare
from lockstep.gate.job import Job
from lockstep.gate.run_result import Run, read_rows, summary

WORKLOAD = """
import time
import torch
from lockstep import track

torch.manual_seed(0)
torch.set_num_threads(1)
x, w = torch.randn(256, 256), torch.randn(256, 256) / 16
steps = track.protocol().max_steps or 15
for step in range(1, steps + 1):
    start = time.perf_counter()
    y = x
    for _ in range({work}):
        y = torch.tanh(y @ w)
    track.log(step, loss=float(y.mean()), step_time_s=time.perf_counter() - start)
"""


def compare_100k(tmp: Path) -> float:
    n = 100_000
    rng = np.random.default_rng(0)
    base = np.linspace(6, 2, n)
    runs = []
    for _ in range(3):
        noisy = base * (1 + rng.normal(0, 1e-3, n))
        runs.append(
            Run(
                [
                    {"step": i + 1, "loss": float(v), "grad_norm": float(v) / 3, "lr": 1e-3}
                    for i, v in enumerate(noisy)
                ]
            )
        )
    path = golden.write(
        golden.build(runs, {"name": "big", "env_key": "k", "machine": "m"}), tmp / "big.json"
    )
    metrics = tmp / "metrics.jsonl"
    with metrics.open("w") as fh:
        for row in runs[0].rows:
            fh.write(json.dumps(row) + "\n")
    current = Run(read_rows(metrics))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        findings = compare(golden.read(path), current)
        times.append(time.perf_counter() - start)
    assert not [f for f in findings if f.failed and f.gate != "perf"]
    print(
        f"compare a {n:,}-step golden (read + compare, 3 curves): median "
        f"{np.median(times):.3f} s over 5 (file {path.stat().st_size / 1e6:.1f} MB)"
    )
    return float(np.median(times))


def make_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@example"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text(WORKLOAD.format(work=80))
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    return repo


def trials(
    repo: Path, work: int, count: int, rounds: int, steps: int, stored: float, label: str
) -> list[dict]:
    (repo / "train.py").write_text(WORKLOAD.format(work=work))
    job = Job(nproc=1, steps=steps, command=f"{shlex.quote(sys.executable)} train.py")
    out = []
    for t in range(count):
        with tempfile.TemporaryDirectory() as wd:
            base_tree = ab.worktree(repo, "HEAD", Path(wd))
            try:
                base, head = ab.alternate(
                    job, base_tree, repo, rounds, Path(wd) / "runs", progress=lambda _: None
                )
            finally:
                ab.remove_worktree(repo, base_tree)
        (c,) = [c for c in ab.judge(base, head, 0.05, 0.01) if c.figure == "step_time_s"]
        first_head = summary(head[0])["step_time_s"]
        stored_alarm = first_head / stored > 1.05
        out.append(
            {
                "ratio": c.ratio,
                "low": c.low,
                "high": c.high,
                "p": c.p_worse,
                "ab_alarm": c.regression,
                "stored_ratio": first_head / stored,
                "stored_alarm": stored_alarm,
            }
        )
        print(
            f"  {label} trial {t + 1:2d}: A/B ratio {c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}] "
            f"p={c.p_worse:.4f} -> {'ALARM' if c.regression else 'pass '} | stored-baseline "
            f"ratio {first_head / stored:.3f} -> {'ALARM' if stored_alarm else 'pass'}",
            flush=True,
        )
    return out


NEIGHBOUR = """
import random, time
rng = random.Random()
while True:
    end = time.perf_counter() + rng.uniform(0.5, 3.0)
    while time.perf_counter() < end:
        pass
    time.sleep(rng.uniform(0.0, 2.0))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--skip-ab", action="store_true", help="only the 100k compare")
    parser.add_argument("--load", type=int, default=0, help="busy neighbour processes")
    parser.add_argument("--only-aa", action="store_true", help="skip the +10%% trials")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        compare_100k(tmp)
        if args.skip_ab:
            return
        repo = make_repo(tmp)
        job = Job(nproc=1, steps=args.steps, command=f"{shlex.quote(sys.executable)} train.py")
        import os

        os.chdir(repo)
        stored = summary(job.run(tmp / "stored"))["step_time_s"]
        print(f"stored baseline (one base run at the start): {stored * 1e3:.2f} ms/step")
        neighbours = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) for _ in range(args.load)]
        try:
            started = time.perf_counter()
            aa = trials(repo, 80, args.trials, args.rounds, args.steps, stored, "A/A")
            slow = (
                []
                if args.only_aa
                else trials(repo, 88, args.trials, args.rounds, args.steps, stored, "+10%")
            )
        finally:
            for proc in neighbours:
                proc.kill()
        n, m = args.trials, len(slow)
        print(
            f"\n{n} A/A trials and {m} trials with a 10% slower head, {args.rounds} rounds "
            f"each, {args.load} busy neighbours, {time.perf_counter() - started:.0f} s"
        )
        print("| rule | A/A false alarms | 10% slowdown detected |")
        print("|---|---|---|")
        print(
            f"| A/B gate (ratio > 5% and Mann-Whitney p < 0.01) | "
            f"{sum(t['ab_alarm'] for t in aa)}/{n} | {sum(t['ab_alarm'] for t in slow)}/{m} |"
        )
        print(
            f"| stored baseline, fixed 5% rule | {sum(t['stored_alarm'] for t in aa)}/{n} | "
            f"{sum(t['stored_alarm'] for t in slow)}/{m} |"
        )
        ratios = [t["ratio"] for t in aa]
        print(
            f"A/A ratio spread: min {min(ratios):.3f} max {max(ratios):.3f}; stored-baseline "
            f"ratios on A/A: min {min(t['stored_ratio'] for t in aa):.3f} max "
            f"{max(t['stored_ratio'] for t in aa):.3f}"
        )
        if slow:
            print(f"+10% measured ratio: median {np.median([t['ratio'] for t in slow]):.3f}")


if __name__ == "__main__":
    main()
