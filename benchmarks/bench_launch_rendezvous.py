"""CPU of one launch's rendezvous in the launching process: torchelastic's event names by
`inspect.stack()` (torch's `dynamic_rendezvous.get_method_name`) against lockstep's
(`lockstep.compat.quick_rendezvous_event_names`), side by side in one run.

Each launch is `lockstep.launch.ranks.run_command` with `--run-path` on 2 forked ranks of an
empty script, so the launching process's own CPU (RUSAGE_SELF) is mostly the elastic agent's.
It is started from a call stack `--depth` frames deep above a frame exec'd from a string, with
`--preload` modules imported first: what `inspect.stack()` pays for (every frame's source,
and each frame's module looked up, through all of `sys.modules` for the exec'd one). The
defaults are what a pytest-xdist worker of the CPU tier has (about 60 frames; torch,
DeepSpeed and transformers imported); `--depth 10 --preload` (none) is closer to a plain
`lockstep check` from a shell.

    .nox/locked-cpu/bin/python benchmarks/bench_launch_rendezvous.py [--launches 4]

Prints, per side, the launching process's CPU-s per launch (median of alternating A B runs)
and the ratio.
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _deep(depth: int, call):
    return call() if depth <= 0 else _deep(depth - 1, call)


def _under_exec(depth: int, call):
    """`call` from `depth` frames above a frame of code exec'd from a string, as a pytest-xdist
    worker's tests run (execnet execs its worker's source): a frame whose module `inspect`
    looks for through all of `sys.modules`, each time."""
    scope = {"_deep": _deep, "depth": depth, "call": call}
    exec(compile("result = _deep(depth, call)", "<string>", "exec"), scope)
    return scope["result"]


def _launch(folder: Path, script: Path) -> float:
    from lockstep.launch.ranks import run_command

    before = _cpu()
    code = run_command([str(script)], 2, folder / "run.log", env=dict(os.environ), timeout=120,
                       cwd=folder, run_path=True)  # fmt: skip
    if code != 0:
        raise SystemExit(f"a launch exited {code}: {(folder / 'run.log').read_text()[-2000:]}")
    return _cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4, help="per side")
    parser.add_argument("--depth", type=int, default=60, help="frames below each launch")
    parser.add_argument("--preload", nargs="*", default=["deepspeed", "transformers.trainer"])
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name in args.preload:
        importlib.import_module(name)
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    import lockstep.launch.cleanup as cleanup

    torchs, lockstep_s = dynamic_rendezvous.get_method_name, cleanup.quick_rendezvous_event_names

    def as_torch():
        dynamic_rendezvous.get_method_name = torchs

    sides = {"torch's (inspect.stack)": as_torch, "lockstep's (one frame)": lockstep_s}
    cpu = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="lockstep-bench-") as tmp:
        script = Path(tmp) / "empty.py"
        script.write_text("pass\n")
        _launch(Path(tmp), script)  # the forkserver started, outside the measurement
        for _ in range(args.launches):
            for name, install in sides.items():
                cleanup.quick_rendezvous_event_names = install
                cpu[name].append(_under_exec(args.depth, lambda: _launch(Path(tmp), script)))
    cleanup.quick_rendezvous_event_names = lockstep_s
    print(f"{args.launches} launches a side, {args.depth} frames deep, "
          f"{len(sys.modules)} modules imported")  # fmt: skip
    for name, values in cpu.items():
        print(f"  {name:26s} {statistics.median(values):6.3f} CPU-s a launch "
              f"(launching process; runs: {', '.join(f'{v:.3f}' for v in values)})")  # fmt: skip
    a, b = (statistics.median(v) for v in cpu.values())
    print(f"  ratio {a / b:.1f}x")


if __name__ == "__main__":
    main()
