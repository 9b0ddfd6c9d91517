"""Wall time of `nox -s tests` and the share of it spent starting rank processes.

A rank's start is the time from its exec() to its first `init_process_group` returning:
the interpreter, `import torch` (and DeepSpeed, transformers, ...) and the rendezvous. Every
Python process of the locked venv is watched through a `.pth` hook that this script puts into
the venv's site-packages for the run only (and removes afterwards): the hook wraps
`torch.distributed.init_process_group` and, on its first return in a process, writes the
process's start (from /proc/self/stat) and that moment, both on the boot clock. Processes
started by tests through torchrun, the lockstep CLI or the plugin's pool are all counted,
whatever environment the test gives them.

    .venv/bin/python benchmarks/bench_suite_starts.py [-- PYTEST ARGS]

The locked venv (.nox/locked-cpu) is made first if it is missing, outside the measurement.

Prints the session's wall time, the number of rank processes, the sum and median of their
start times, the share of the machine (cores x wall) they took, and the share of the wall time
during which at least one rank was starting.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".nox" / "locked-cpu"
ENV_VAR = "LOCKSTEP_BENCH_STARTS"

HOOK = '''
"""Benchmark hook (benchmarks/bench_suite_starts.py): record when this process's first
init_process_group returns. Inert unless LOCKSTEP_BENCH_STARTS names a directory."""
import os

_OUT = os.environ.get("LOCKSTEP_BENCH_STARTS")


def _install():
    import functools
    import importlib.abc
    import importlib.machinery
    import json
    import sys
    import time

    def since_boot_at_start():
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks

    started = since_boot_at_start()
    done = []

    def record():
        if done:
            return
        done.append(True)
        row = {
            "pid": os.getpid(),
            "argv": sys.orig_argv[:4],
            # a rank: started by torchrun's agent (elastic) or by multiprocessing (the pool)
            "rank": bool(os.environ.get("TORCHELASTIC_RUN_ID"))
            or any("spawn_main" in a for a in sys.orig_argv),
            "start": started,
            "ready": time.clock_gettime(time.CLOCK_BOOTTIME),
        }
        with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump(row, f)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch.distributed.distributed_c10d":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_wrap(module):
                exec_module(module)
                init = module.init_process_group

                @functools.wraps(init)
                def init_process_group(*args, **kwargs):
                    result = init(*args, **kwargs)
                    record()
                    return result

                module.init_process_group = init_process_group

            spec.loader.exec_module = exec_and_wrap
            return spec

    sys.meta_path.insert(0, Finder())


if _OUT:
    _install()
'''


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main() -> int:
    pytest_args = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    if not VENV.is_dir():  # make the locked venv first, outside the measurement
        nox = [sys.executable, "-m", "nox", "-s", "tests", "--", "--collect-only", "-q"]
        subprocess.run(nox, cwd=ROOT, check=True, capture_output=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(VENV), "platbase": str(VENV)}))
    hook, pth = site / "lockstep_bench_starts_hook.py", site / "lockstep_bench_starts.pth"
    with tempfile.TemporaryDirectory() as out:
        hook.write_text(HOOK)
        pth.write_text("import lockstep_bench_starts_hook\n")
        try:
            env = {**os.environ, ENV_VAR: out}
            t0 = time.clock_gettime(time.CLOCK_BOOTTIME)
            proc = subprocess.run(
                [sys.executable, "-m", "nox", "-s", "tests", "--", *pytest_args],
                cwd=ROOT,
                env=env,
            )
            t1 = time.clock_gettime(time.CLOCK_BOOTTIME)
        finally:
            hook.unlink(missing_ok=True)
            pth.unlink(missing_ok=True)
        recorded = [json.loads(p.read_text()) for p in Path(out).glob("*.json")]
    # Processes that are not ranks (a pytest worker running a world-size-1 group in-process)
    # start long before their first group: not a start cost.
    rows = [r for r in recorded if r["rank"]]
    wall = t1 - t0
    starts = [r["ready"] - r["start"] for r in rows]
    busy = union_length([(max(r["start"], t0), r["ready"]) for r in rows])
    cores = os.cpu_count() or 1
    print(f"\nnox -s tests: exit {proc.returncode}, wall {wall:.1f} s on {cores} cores")
    if not rows:
        print("no rank process was recorded")
        return 1
    print(
        f"rank processes started: {len(rows)} (and {len(recorded) - len(rows)} other processes "
        "with an in-process group, not counted)"
    )
    print(
        f"start (exec -> first init_process_group returned): median "
        f"{statistics.median(starts):.2f} s, max {max(starts):.2f} s, sum {sum(starts):.0f} s"
    )
    print(f"share of the machine ({cores} cores x wall): {sum(starts) / (cores * wall):.0%}")
    print(f"share of the wall time with at least one rank starting: {busy / wall:.0%}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
