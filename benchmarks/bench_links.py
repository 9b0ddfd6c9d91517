"""The link stage (issue 23): the schedule and verdict simulated at scale, and the stage on the
cluster bed.

    python benchmarks/bench_links.py sim [--trials 20]             # 1,024 and 4,096 nodes
    python benchmarks/bench_links.py time [--repeat 5]             # root: 4-node bed
    python benchmarks/bench_links.py contrast [--repeat 3]         # root: 4-node bed
    python benchmarks/bench_links.py sweep [--sweep 20] [--nodes 4 8] [--hogs N]   # root
        [--unshaped] [--fault node|link] [--save FILE]
    python benchmarks/bench_links.py probe --rate 1gbit --burst 64kb [--nodes 4 8]  # root

sim: synthetic bandwidths (100 Gb/s, 5% Gaussian noise), slow nodes (a fifth) and slow links
(a fifth) planted at random, independently of the schedule, through the stage's own plan (first
pass, confirmation rounds, second pass; `lockstep.preflight.links.schedule.second_plan`). Beyond the full-matrix
size: every slow node named within 2 log2(N) + 4 rounds with no false one; the probability of
finding one slow link per round budget (more random rounds); the verdict's time at 4,096 nodes
(`judge`, and `assess`, the report's whole section), in CPU seconds and wall seconds.

On the bed (the bed shapes every node's link, `lockstep_testbed.network.LINK_RATE`), one rank per
node started with the generic launcher variables, as tests/cluster/test_links.py does, the
stage's default message size:
- time: preflight with the link stage and without (`--no-links`), alternately, `--repeat`
  times each: rank 0's preflight time (after import torch) and the stage's own;
- contrast: what the stage measures on a shaped link and on an unshaped one (nodes 1 and 2's
  shaping removed, so the link between them is bound by this machine's CPU only), and on a bed
  with no shaping at all;
- sweep: the false-alarm sweep: `--sweep` preflights on clean 4- and 8-node beds with the
  stage's default (on across hosts), counting the runs that named anything (exit code not 0 or
  a problem listed), and the CPU-starved transfers (measured again) and links (not judged);
  `--hogs N` runs N busy loops beside it all the while (a loaded machine); the load average
  at each run is printed. `--unshaped`: no tc on the links (veth on one bridge: CPU-bound,
  noisy readings). `--fault node` plants ls2 at 40 Mbit/s (tbf both ways), `--fault link` the
  link ls1-ls3 alone at 100 Mbit/s (htb + u32), and counts the runs that named exactly that
  (the link as a link). `--save FILE` appends each run's links section (JSON lines);
- probe: links shaped to `--rate`/`--burst` instead of the bed's own: the spread of clean links
  (to pick a rate this machine sustains on all pairs at once).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lockstep.preflight.links import schedule, section, stats, verdict

# The bed is development only (testbed/, never in the wheel): from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))


def measure(rounds, slow_nodes, slow_links, rng, noise=0.05, offset=0):
    out = []
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            g = 100 * max(0.05, rng.gauss(1.0, noise))
            if a in slow_nodes or b in slow_nodes:
                g /= 5
            if (min(a, b), max(a, b)) in slow_links:
                g /= 5
            out.append({"a": a, "b": b, "gbps": g, "rail": 0, "ranks": [a, b], "round": offset + k})
    return out


def staged(n, slow, pairs, rng, seed, extra=0):
    """The stage's plan on synthetic links: (links, rounds used)."""
    first = schedule.first_pass(n, seed=seed, rounds=schedule.first_pass_rounds(n) + extra)
    links = measure(first, slow, pairs, rng)
    plan = schedule.second_plan(n, links, sampled=True, seed=seed + 1)
    links += measure(plan, slow, pairs, rng, offset=len(first))
    return links, len(first) + len(plan)


def sim(trials: int) -> None:
    for n in (1024, 4096):
        found = false = 0
        planted_total = 0
        rounds_used = []
        judge_cpu, judge_wall, assess_cpu = [], [], []
        hosts, ranks, local = [f"n{k}" for k in range(n)], [[k] for k in range(n)], [0] * n
        for t in range(trials):
            rng = random.Random(1000 * n + t)
            slow = set(rng.sample(range(n), max(1, n // 256)))  # 4 or 16 slow nodes
            links, used = staged(n, slow, set(), rng, t)
            rounds_used.append(used)
            merged = stats.best_of(links)
            c0, w0 = time.process_time(), time.perf_counter()
            v = verdict.judge(n, merged, pairs_merged=True)
            judge_cpu.append(time.process_time() - c0)
            judge_wall.append(time.perf_counter() - w0)
            c0 = time.process_time()
            report = section.assess(
                hosts=hosts, ranks=ranks, local=local, cross=links, timeout_s=60
            )
            assess_cpu.append(time.process_time() - c0)
            assert report["exclude"] == [f"n{k}" for k in v["exclude"]]
            named = {s["node"] for s in v["slow_nodes"]}
            found += len(named & slow)
            false += len(named - slow) + len(v["slow_links"])
            planted_total += len(slow)
        print(
            f"N={n}: slow nodes named {found}/{planted_total} over {trials} trials, false "
            f"findings {false}, rounds at most {max(rounds_used)} (budget {schedule.budget(n)}); "
            f"judge CPU median {statistics.median(judge_cpu):.3f} s, max {max(judge_cpu):.3f} s "
            f"(wall max {max(judge_wall):.3f} s); the whole report section (assess) CPU median "
            f"{statistics.median(assess_cpu):.3f} s, max {max(assess_cpu):.3f} s",
            flush=True,
        )
        for extra in (0, 8, 32, 128):
            hits = 0
            for t in range(trials * 5):
                rng = random.Random(7 * n + t)
                a, b = rng.sample(range(n), 2)
                pair = {(min(a, b), max(a, b))}
                links, total = staged(n, set(), pair, rng, t, extra)
                v = verdict.judge(n, stats.best_of(links))
                hits += any((s["a"], s["b"]) == min(pair) for s in v["slow_links"])
            print(
                f"  N={n}: one slow link found in {hits}/{trials * 5} trials with {total} "
                f"rounds (expected about {total}/{n - 1} = {total / (n - 1):.4f})",
                flush=True,
            )


# ---------------------------------------------------------------------- the bed

_PORT = [29600 + random.randrange(0, 2000, 50)]


def launch(bed, extra=(), timeout=60, nbytes=None):
    """One rank per node; (rank 0's exit code, its report or None, rank 0's output tail)."""
    n = len(bed.names)
    _PORT[0] += 1
    report = bed.shared / f"r{_PORT[0]}.json"
    procs = {}
    for k in range(n):
        env = {
            "RANK": str(k), "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": bed.hostname(0), "MASTER_PORT": str(_PORT[0]),
        }  # fmt: skip
        if nbytes:
            env["LOCKSTEP_LINK_BYTES"] = str(nbytes)
        argv = [bed.python, "-m", "lockstep", "preflight", "--timeout", str(timeout), *extra]
        if k == 0:
            argv += ["--json", str(report)]
        procs[k] = bed.popen(k, argv, env=env, stderr=subprocess.PIPE)
    res = bed.wait_all(procs, 300)
    first = res[bed.names[0]]
    data = json.loads(report.read_text()) if report.exists() else None
    return first.returncode, data, (first.stdout + first.stderr)[-2000:]


def _links_summary(data) -> str:
    links = data["links"]
    values = [x["gbps"] for x in links["links"]]
    return (
        f"links {min(values):.3f}-{max(values):.3f} Gb/s (median {statistics.median(values):.3f}),"
        f" {links['rounds']} rounds, stage {links['elapsed_s']:.2f} s, findings "
        f"{links['findings'] or 'none'}"
    )


def _unshape(bed, k) -> None:
    """Node k's shaping removed both ways (clear_rate_limit would restore the bed's own)."""
    for where, dev in ((k, bed.interface(k)), ("head", f"v{bed.name(k)}")):
        bed.run(where, ["tc", "qdisc", "del", "dev", dev, "root"], timeout=10)


def _describe_rate(bed) -> str:
    return f"{bed.link_rate} (burst {bed.link_burst})" if bed.link_rate else "unshaped"


def bench_time(repeat: int) -> None:
    from lockstep_testbed import Cluster

    with Cluster(4, env={"NO_COLOR": "1"}) as bed:
        on, off = [], []
        for _ in range(repeat):
            code_on, data_on, tail = launch(bed, ("--links",))
            assert data_on is not None and "links" in data_on, tail
            code_off, data_off, tail = launch(bed, ("--no-links",))
            assert data_off is not None and "links" not in data_off, tail
            on.append(data_on)
            off.append(data_off)
            print(
                f"  with: {data_on['elapsed_s']:.2f} s (exit {code_on}; {_links_summary(data_on)});"
                f" without: {data_off['elapsed_s']:.2f} s (exit {code_off})",
                flush=True,
            )
        t_on = [d["elapsed_s"] for d in on]
        t_off = [d["elapsed_s"] for d in off]
        stage = [d["links"]["elapsed_s"] for d in on]
        print(
            f"4-node bed, links {_describe_rate(bed)}, {repeat} runs each: preflight with the "
            f"link stage median {statistics.median(t_on):.2f} s (min {min(t_on):.2f}, max "
            f"{max(t_on):.2f}), without median {statistics.median(t_off):.2f} s (min "
            f"{min(t_off):.2f}, max {max(t_off):.2f}); added (difference of medians) "
            f"{statistics.median(t_on) - statistics.median(t_off):.2f} s; the stage's own time "
            f"median {statistics.median(stage):.2f} s (min {min(stage):.2f}, max {max(stage):.2f})"
        )


def bench_contrast(repeat: int) -> None:
    from lockstep_testbed import Cluster

    with Cluster(4, env={"NO_COLOR": "1"}) as bed:
        for k in (1, 2):
            _unshape(bed, k)
        for _ in range(repeat):
            code, data, tail = launch(bed, ("--links",))
            assert data is not None, tail
            m = data["links"]["matrix_gbps"]
            print(
                f"ls1, ls2 unshaped, ls0, ls3 {_describe_rate(bed)}: ls1-ls2 (unshaped) {m[1][2]} "
                f"Gb/s; ls0-ls3 (shaped) {m[0][3]} Gb/s; ls0-ls1 {m[0][1]}, ls2-ls3 {m[2][3]} "
                f"(one end shaped); exit {code}, findings {data['links']['findings'] or 'none'}",
                flush=True,
            )
    with Cluster(4, env={"NO_COLOR": "1"}, link_rate=None) as bed:
        for _ in range(repeat):
            code, data, tail = launch(bed, ("--links",))
            assert data is not None, tail
            print(f"no shaping at all: exit {code}, {_links_summary(data)}", flush=True)
            for p in data["links"]["problems"]:
                print(f"    {p}")


def _bed_env() -> dict:
    """The ranks' environment: this checkout's lockstep where PYTHONPATH names it (the bed's
    nodes start from a clean environment)."""
    env = {"NO_COLOR": "1"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


FAULTS = {
    # a node at 40 Mbit/s both ways (tbf), a single link at 100 Mbit/s (htb + u32 on ls1, ls3)
    "node": "ls2 at 40mbit",
    "link": "ls1-ls3 at 100mbit",
}


def _plant(bed, fault: str | None) -> None:
    if fault == "node":
        bed.rate_limit(2, "40mbit", burst=bed.link_burst)
    elif fault == "link":
        others = bed.link_rate or "100gbit"  # unshaped: the other traffic as good as unlimited
        bed.rate_limit_pair(1, 3, "100mbit", others=others, burst=bed.link_burst)


def bench_sweep(
    runs: int,
    sizes,
    rate=None,
    burst=None,
    hogs: int = 0,
    *,
    unshaped: bool = False,
    fault: str | None = None,
    save: str | None = None,
) -> None:
    from lockstep_testbed import Cluster

    for n in sizes:
        kwargs = {} if rate is None else {"link_rate": rate, "link_burst": burst}
        if unshaped:
            kwargs["link_rate"] = None
        with Cluster(n, env=_bed_env(), **kwargs) as bed:
            _plant(bed, fault)
            busy = [bed.popen(0, ["sh", "-c", "while :; do :; done"]) for _ in range(hogs)]
            try:
                _sweep(bed, n, runs, hogs, fault, save)
            finally:
                for proc in busy:
                    proc.kill_tree()
                    proc.communicate()


def _right(links: dict, fault: str | None) -> bool:
    """Whether a run named exactly the planted fault (nothing, on a clean bed)."""
    nodes = sorted({s["host"] for s in links["slow_nodes"]})
    pairs = sorted({tuple(sorted(s["hosts"])) for s in links["slow_links"]})
    if fault == "node":
        return nodes == ["ls2"] and pairs == []
    if fault == "link":
        return nodes == [] and pairs == [("ls1", "ls3")]
    return not links["problems"]


def _sweep(bed, n: int, runs: int, hogs: int, fault: str | None, save: str | None) -> None:
    alarms, right, ratios, stages, confirmed = 0, 0, [], [], 0
    reps = starved = extra = unjudged = unjudged_runs = 0
    loads = []
    start = time.monotonic()
    for i in range(runs):
        load = os.getloadavg()[0]
        loads.append(load)
        code, data, tail = launch(bed)  # the default: on across hosts
        if data is None or "links" not in data:
            alarms += 1
            print(f"  run {i}: load {load:.1f}, exit {code}, no report: {tail[-600:]}", flush=True)
            continue
        links = data["links"]
        if save:
            with open(save, "a") as f:
                f.write(json.dumps({"run": i, "n": n, "fault": fault, "load": load,
                                    "code": code, "links": links}) + "\n")  # fmt: skip
        named = code != 0 or bool(links["problems"])
        alarms += named
        right += code == (1 if fault else 0) and _right(links, fault)
        typical = links["typical_gbps"]
        judged = [x for x in links["links"] if not x.get("starved")]
        ratios += [x["gbps"] / typical for x in judged] if typical else []
        stages.append(links["elapsed_s"])
        again = sum(x.get("measurements", 1) > 1 for x in links["links"])
        confirmed += again > 0  # a link looked slow once: measured again
        cpu = links["cpu_wait"]
        reps += cpu["reps"]
        starved += cpu["starved_reps"]
        extra += cpu["extra_reps"]
        unjudged += len(links["not_judged"])
        unjudged_runs += bool(links["not_judged"])
        print(
            f"  run {i}: load {load:.1f}, exit {code}, typical {typical} Gb/s, "
            f"{_links_summary(data)}, {again} measured again; transfers {cpu['reps']}, "
            f"CPU-starved {cpu['starved_reps']}, extra {cpu['extra_reps']}, not judged "
            f"{len(links['not_judged'])}" + (f"; {links['problems']}" if named else ""),
            flush=True,
        )
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
    what = f"{FAULTS[fault]}: named right in {right} of {runs}" if fault else "clean"
    print(
        f"{n}-node bed, links {_describe_rate(bed)}, {what}; {hogs} busy loops beside it (load "
        f"{min(loads):.1f}-{max(loads):.1f}, each run's: {' '.join(f'{x:.1f}' for x in loads)}): "
        f"{alarms} of {runs} runs named a slow node or link; "
        f"every judged link at {spread} of its run's typical; {confirmed} runs measured a link "
        f"again (it looked slow once); {reps} transfers, {starved} CPU-starved, {extra} extra; "
        f"{unjudged} links not judged in {unjudged_runs} runs; the stage median "
        f"{statistics.median(stages) if stages else math.nan:.2f} s (max "
        f"{max(stages, default=math.nan):.2f}); {time.monotonic() - start:.0f} s in all",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("sim", "time", "contrast", "sweep", "probe"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sweep", type=int, default=20)
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rate")
    parser.add_argument("--burst", default="64kb")
    parser.add_argument("--hogs", type=int, default=0, help="sweep: busy loops beside it")
    parser.add_argument("--unshaped", action="store_true", help="sweep: no tc on the links")
    parser.add_argument("--fault", choices=sorted(FAULTS), help="sweep: plant one (FAULTS)")
    parser.add_argument("--save", help="sweep: append each run's links section to this file")
    args = parser.parse_args()
    os.environ.setdefault("NO_COLOR", "1")
    if args.what == "sim":
        sim(args.trials)
    elif args.what == "time":
        bench_time(args.repeat)
    elif args.what == "contrast":
        bench_contrast(args.repeat)
    elif args.what == "sweep":
        bench_sweep(
            args.sweep,
            args.nodes,
            hogs=args.hogs,
            unshaped=args.unshaped,
            fault=args.fault,
            save=args.save,
        )
    else:
        bench_sweep(args.repeat, args.nodes, args.rate, args.burst)


if __name__ == "__main__":
    main()
