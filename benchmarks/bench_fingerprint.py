"""Fingerprint collection against `torch.utils.collect_env`, each net of `import torch`.

Each run is a fresh interpreter that imports torch first and then times only the collection,
so the comparison is net of `import torch` by construction (subtracting two whole-process
times drowns in noise on a shared machine). Runs alternate; medians of --repeat. Goal (issue
3): at most 0.1 s, at least 8x faster than collect_env, with more fields.

    .venv/bin/python benchmarks/bench_fingerprint.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# Bytecode cached as in any installed package (some shells here set PYTHONDONTWRITEBYTECODE),
# kept outside the source tree.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "lockstep-bench-pycache")

TIMED = """
import json, time, torch
start = time.perf_counter()
{body}
print(json.dumps([time.perf_counter() - start, fields]))
"""
FINGERPRINT = """
from lockstep.env.compare import flatten
from lockstep.env.fingerprint import collect
fp = collect()
fields = len([f for f in flatten(fp["sections"], "") if ".installed." not in f])
"""
COLLECT_ENV = """
from torch.utils import collect_env
collect_env.get_pretty_env_info()
fields = len(collect_env.SystemEnv._fields)
"""


def timed(body: str) -> tuple[float, int]:
    code = TIMED.format(body=body.strip())
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV
    )
    seconds, fields = json.loads(out.stdout.strip().splitlines()[-1])
    return seconds, fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"lockstep fingerprint": [], "collect_env": []}
    fields: dict[str, int] = {}
    timed(FINGERPRINT)  # warm-up: writes the bytecode cache
    for _ in range(args.repeat):
        for name, body in (("lockstep fingerprint", FINGERPRINT), ("collect_env", COLLECT_ENV)):
            seconds, fields[name] = timed(body)
            runs[name].append(seconds)
    med = {name: statistics.median(values) for name, values in runs.items()}
    print(f"net of import torch, fresh interpreter each, median of {args.repeat}:")
    for name, values in runs.items():
        print(f"  {name:<21} {med[name]:.3f} s (min {min(values):.3f}, max {max(values):.3f})")
    print(f"speed-up: {med['collect_env'] / med['lockstep fingerprint']:.1f}x")
    print(
        f"fields: lockstep {fields['lockstep fingerprint']} (flattened, not counting one per "
        f"installed package), collect_env {fields['collect_env']} (SystemEnv fields)"
    )


if __name__ == "__main__":
    main()
