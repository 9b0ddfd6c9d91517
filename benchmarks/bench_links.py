"""The link stage (issue 23): the schedule and verdict simulated at scale, and the stage on the
4-node bed.

    python benchmarks/bench_links.py sim [--trials 20]        # 1,024 and 4,096 nodes
    python benchmarks/bench_links.py bed [--sweep 20]         # root: the cluster bed

sim: synthetic bandwidths (100 Gb/s, 5% Gaussian noise), slow nodes (a fifth) and slow links
(a fifth) planted at random, independently of the schedule. Beyond the full-matrix size:
every slow node named within 2 log2(N) + 4 rounds with no false one; the probability of
finding one slow link per round budget (more random rounds); the verdict's time at 4,096.
bed: preflight with and without the link stage on 4 shaped nodes (the added time), one
link shaped and one not (the contrast), and the false-alarm sweep on clean 4- and 8-node beds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

from lockstep.env import link_verdict as lv


def measure(rounds, slow_nodes, slow_links, rng, noise=0.05):
    out = []
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            g = 100 * max(0.05, rng.gauss(1.0, noise))
            if a in slow_nodes or b in slow_nodes:
                g /= 5
            if (min(a, b), max(a, b)) in slow_links:
                g /= 5
            out.append({"a": a, "b": b, "gbps": g, "round": k})
    return out


def sim(trials: int) -> None:
    for n in (1024, 4096):
        found = false = 0
        planted_total = 0
        rounds_used = []
        judge_s = []
        for t in range(trials):
            rng = random.Random(1000 * n + t)
            slow = set(rng.sample(range(n), max(1, n // 256)))  # 4 or 16 slow nodes
            _, first = lv.schedule(n, seed=t)
            links = measure(first, slow, set(), rng)
            second = lv.second_pass(n, lv.suspects(n, links), seed=t + 1)
            links += measure(second, slow, set(), rng)
            rounds_used.append(len(first) + len(second))
            start = time.perf_counter()
            v = lv.judge(n, links)
            judge_s.append(time.perf_counter() - start)
            named = {s["node"] for s in v["slow_nodes"]}
            found += len(named & slow)
            false += len(named - slow) + len(v["slow_links"])
            planted_total += len(slow)
        print(
            f"N={n}: slow nodes named {found}/{planted_total} over {trials} trials, false "
            f"findings {false}, rounds {max(rounds_used)} (budget {lv.budget(n)}), verdict "
            f"median {statistics.median(judge_s):.3f} s, max {max(judge_s):.3f} s"
        )
        for extra in (0, 8, 32, 128):
            hits = 0
            for t in range(trials * 5):
                rng = random.Random(7 * n + t)
                a, b = rng.sample(range(n), 2)
                pair = {(min(a, b), max(a, b))}
                first = lv.first_pass(n, seed=t, rounds=lv.first_pass_rounds(n) + extra)
                links = measure(first, set(), pair, rng)
                second = lv.second_pass(n, lv.suspects(n, links), seed=t + 1)
                links += measure(second, set(), pair, rng)
                v = lv.judge(n, links)
                hits += any((s["a"], s["b"]) == min(pair) for s in v["slow_links"])
            total = len(first) + lv.SECOND_PASS
            print(
                f"  N={n}: one slow link found in {hits}/{trials * 5} trials with {total} "
                f"rounds (expected about {total}/{n - 1} = {total / (n - 1):.4f})"
            )


def bed(sweep: int) -> None:
    sys.path.insert(0, "tests/cluster")
    from lockstep.cluster import Cluster

    rate, burst, nbytes = "100mbit", "16kb", 1 << 20

    def run(b, extra=(), port=29600):
        n = len(b.names)
        report = b.shared / f"r{port}.json"
        procs = {}
        for k in range(n):
            env = {
                "RANK": str(k), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": b.hostname(0),
                "MASTER_PORT": str(port), "LOCKSTEP_LINK_BYTES": str(nbytes),
            }  # fmt: skip
            argv = [b.python, "-m", "lockstep", "preflight", "--timeout", "60", *extra]
            if k == 0:
                argv += ["--json", str(report)]
            procs[k] = b.popen(k, argv, env=env, stderr=subprocess.PIPE)
        res = b.wait_all(procs, 300)
        return res["ls0"].returncode, json.loads(report.read_text())

    port = 29600
    with Cluster(4, env={"NO_COLOR": "1"}) as b:
        for k in range(4):
            b.rate_limit(k, rate, burst=burst)
        on, off = [], []
        for _ in range(3):
            port += 2
            on.append(run(b, port=port)[1])
            off.append(run(b, ("--no-links",), port=port + 1)[1])
        stage = [r["links"]["elapsed_s"] for r in on]
        print(
            f"4-node bed, {rate}: preflight with links median "
            f"{statistics.median(r['elapsed_s'] for r in on):.2f} s, without "
            f"{statistics.median(r['elapsed_s'] for r in off):.2f} s; link stage "
            f"{statistics.median(stage):.2f} s (min {min(stage):.2f}, max {max(stage):.2f})"
        )
        b.tc(1, "qdisc", "del", "dev", b.interface(1), "root")
        b.tc("head", "qdisc", "del", "dev", "vls1", "root")
        port += 2
        code, r = run(b, port=port)
        m = r["links"]["matrix_gbps"]
        print(
            f"ls1 unshaped, others {rate}: ls0-ls1 {m[0][1]} Gb/s (ls1 unshaped, ls0 shaped), "
            f"ls0-ls2 {m[0][2]} Gb/s, ls2-ls3 {m[2][3]} Gb/s; exit {code}, findings "
            f"{r['findings']}"
        )
    for n in (4, 8):
        with Cluster(n, env={"NO_COLOR": "1"}) as b:
            for k in range(n):
                b.rate_limit(k, rate, burst=burst)
            alarms = 0
            start = time.monotonic()
            for _ in range(sweep):
                port += 1
                code, r = run(b, port=port)
                alarms += code != 0 or bool(r["links"]["problems"])
            print(
                f"clean {n}-node bed: {alarms} of {sweep} runs named a slow node or link "
                f"({time.monotonic() - start:.0f} s)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("sim", "bed"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--sweep", type=int, default=20)
    args = parser.parse_args()
    sim(args.trials) if args.what == "sim" else bed(args.sweep)


if __name__ == "__main__":
    main()
