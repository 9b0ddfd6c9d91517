"""`lockstep check NAME --script CMD`: training invariant checks on a user's script.

Exit codes: 0 every check passed, 1 a check failed, 2 bad input (including a script that
crashes or ignores the protocol), 3 a run timed out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_OK, UsageError

SCRIPT_CHECKS = ("determinism", "resume", "world-size")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run training invariant checks (determinism, resume, world-size) on your script",
        description="Launch your training script through torchrun several times and compare "
        "the per-step metrics it logs with lockstep.track.log (see README, 'Check your own "
        "training script').",
    )
    p.add_argument("name", choices=[*SCRIPT_CHECKS, "all"], help="the check to run")
    p.add_argument(
        "--script",
        required=True,
        metavar="CMD",
        help="the training command, e.g. 'train.py --lr 3e-4' or 'python -m pkg.train'",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks per run (default 2)")
    p.add_argument(
        "--steps",
        type=int,
        default=8,
        help="optimizer steps per run; resume stops at half (default 8)",
    )
    p.add_argument(
        "--world-sizes",
        default="1,2",
        metavar="N,N",
        help="world sizes compared by the world-size check (default 1,2)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance (default 0 for determinism/resume, 1e-4 world-size)",
    )
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    p.add_argument("--out", type=Path, default=None, help="folder for runs and logs")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results here")
    p.set_defaults(func=run_checks)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or any(n < 1 for n in sizes):
        raise UsageError(f"--world-sizes wants two or more positive integers, got {text!r}")
    return sizes


def run_checks(args: argparse.Namespace) -> int:
    from rich.console import Console

    from lockstep.checks import script

    if args.nproc < 1 or args.steps < 2:
        raise UsageError("--nproc must be at least 1 and --steps at least 2")
    sizes = _sizes(args.world_sizes)
    workdir = args.out or Path(tempfile.mkdtemp(prefix="lockstep-check-"))
    runner = script.ScriptRunner(args.script, workdir, timeout=args.timeout)
    names = SCRIPT_CHECKS if args.name == "all" else (args.name,)
    exact = {"rtol": args.rtol or 0.0, "atol": args.atol or 0.0}
    console = Console(stderr=False, highlight=False)
    results = []
    for name in names:
        if name == "determinism":
            result = script.check_determinism(runner, args.nproc, args.steps, **exact)
        elif name == "resume":
            result = script.check_resume(runner, args.nproc, args.steps, **exact)
        else:
            tol = {
                "rtol": 1e-4 if args.rtol is None else args.rtol,
                "atol": 1e-6 if args.atol is None else args.atol,
            }
            result = script.check_world_size(runner, sizes, args.steps, **tol)
        results.append(result)
        mark = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
        console.print(f"{mark} {result.name}: {result.summary}")
        if result.diagnosis and not result.passed:
            console.print(f"     likely cause: {result.diagnosis}")
    if not all(r.passed for r in results):
        console.print(f"runs and logs: {workdir}")
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=2) + "\n")
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAIL
