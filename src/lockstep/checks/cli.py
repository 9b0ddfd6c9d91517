"""`lockstep check NAME CONFIG` (lockstep's own harness, any engine) and
`lockstep check NAME --script CMD` (a user's script): training invariant checks. The parser;
the work is in `checks.command` and `checks.plans`.

Exit codes: 0 every check passed, 1 a check failed, 2 bad input (including a script that
crashes or ignores the protocol), 3 a run timed out, 4 a check could not judge (it says why).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep import job_options
from lockstep.checks import registry
from lockstep.inputs import positive_int

SCRIPT_STEPS = 8  # a script's steps without --steps: plans.SCRIPT_STEPS (imported when it runs)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run training invariant checks on a run config or on your own script",
        description="With CONFIG: train lockstep's reference job (any engine) in local ranks "
        "and check determinism, resume, clip, equivalence, world-size, accumulation or "
        "elastic. With --script: launch your training script through torchrun several times "
        "and compare the per-step metrics it logs with lockstep.track.log (determinism, "
        "resume, world-size, replicas; see docs/scripts.md).",
    )
    p.add_argument("name", choices=[*registry.names(), "all"], help="the check to run")
    job_options.job(p, script_steps=SCRIPT_STEPS, steps_note="; resume stops at half")
    p.add_argument(
        "--launcher",
        choices=("torchrun", "deepspeed"),
        default=None,
        help="with --script: launch it through torchrun (default) or the deepspeed CLI, "
        "which passes --local_rank",
    )
    p.add_argument(
        "--world-sizes",
        default="1,2",
        metavar="N,N",
        help="world sizes compared by the world-size check (default 1,2)",
    )
    p.add_argument(
        "--resume-nproc",
        type=positive_int,
        default=None,
        help="with CONFIG: resume on this many ranks instead of --nproc (ddp/fsdp reshard)",
    )
    job_options.first_step_timeout(p)
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help=f"with --script: relative tolerance (default {default_tolerances(0)}); world-size "
        "judges a difference beyond it by a float64 replay and the noise floor",
    )
    p.add_argument(
        "--atol",
        type=float,
        default=None,
        help=f"with --script: absolute tolerance (default {default_tolerances(1)})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for runs and logs (default: a temporary one, removed when all pass); with "
        "--script, the runs an earlier check left there are removed first",
    )
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results here")
    p.set_defaults(func=run_checks)


def default_tolerances(index: int) -> str:
    """What --rtol (`index` 0) or --atol (1) defaults to for each check on a script, read from
    the registry (`OnScript.tolerance`), so the help cannot drift from what runs: '0 for
    determinism, resume, world-size; replicas always compares exactly'."""
    by_value: dict[str, list[str]] = {}
    exact = []
    for name in registry.names(script=True):
        tolerance = registry.CHECKS[name].script.tolerance
        if tolerance is None:
            exact.append(name)
        else:
            by_value.setdefault(f"{tolerance[index]:g}", []).append(name)
    parts = [f"{value} for {', '.join(names)}" for value, names in by_value.items()]
    parts += [f"{name} always compares exactly" for name in exact]
    return "; ".join(parts)


def run_checks(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from lockstep.checks import command, plans

    request = plans.Request(
        name=args.name,
        **asdict(job_options.job_of(args)),
        launcher=args.launcher,
        world_sizes=args.world_sizes,
        resume_nproc=args.resume_nproc,
        rtol=args.rtol,
        atol=args.atol,
        out=args.out,
        first_step_timeout=args.first_step_timeout,
    )
    return command.check(request, args.json)
