"""`lockstep check NAME CONFIG` (lockstep's own harness, any engine) and
`lockstep check NAME --script CMD` (a user's script): training invariant checks.

Exit codes: 0 every check passed, 1 a check failed, 2 bad input (including a script that
crashes or ignores the protocol), 3 a run timed out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lockstep.checks import registry
from lockstep.errors import EXIT_FAIL, EXIT_OK


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
    p.add_argument("config", nargs="?", help="run config (TOML), e.g. smoke/cpu-zero3.toml")
    p.add_argument(
        "--script",
        metavar="CMD",
        help="instead of CONFIG: the training command, e.g. 'train.py --lr 3e-4'",
    )
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="with CONFIG: override a config field (repeatable)",
    )  # fmt: skip
    p.add_argument("--nproc", type=int, default=2, help="ranks per run (default 2)")
    p.add_argument(
        "--launcher",
        choices=("torchrun", "deepspeed"),
        default=None,
        help="with --script: launch it through torchrun (default) or the deepspeed CLI, "
        "which passes --local_rank",
    )
    p.add_argument(
        "--run-path",
        action="store_true",
        help="with --script SCRIPT.py: as torchrun --run-path, run it with runpy in ranks "
        "forked from a process that already imported torch (seconds faster per run on CPU); "
        "not for a script that sets variables before `import torch` for torch to read",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per run; resume stops at half (default: the config's, or 8)",
    )
    p.add_argument(
        "--world-sizes",
        default="1,2",
        metavar="N,N",
        help="world sizes compared by the world-size check (default 1,2)",
    )
    p.add_argument(
        "--resume-nproc",
        type=int,
        default=None,
        help="with CONFIG: resume on this many ranks instead of --nproc (ddp/fsdp reshard)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance (default 0 for determinism/resume, 1e-4 world-size)",
    )
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance")
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help="seconds per launch (default 600 with --script, no limit with a CONFIG); a launch "
        "past it is killed and its ranks' flight recorders name the collective each is in",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="folder for runs and logs")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results here")
    p.set_defaults(func=run_checks)


def run_checks(args: argparse.Namespace) -> int:
    from lockstep.checks import plans

    request = plans.Request(
        name=args.name,
        config=args.config,
        script=args.script,
        overrides=tuple(args.overrides),
        nproc=args.nproc,
        launcher=args.launcher,
        run_path=args.run_path,
        steps=args.steps,
        world_sizes=args.world_sizes,
        resume_nproc=args.resume_nproc,
        rtol=args.rtol,
        atol=args.atol,
        timeout=args.timeout,
        out=args.out,
    )
    outcome = plans.run(request, _report)
    if not outcome.passed:
        print(f"runs and logs: {outcome.workdir}")
    from lockstep.checks.divergence import markdown
    from lockstep.redact import scrub_text
    from lockstep.summary_md import step_summary

    if section := markdown(outcome.results):
        step_summary(scrub_text(section))
    if args.json:
        from lockstep.redact import redact_mapping

        report = [redact_mapping(r.to_dict()) for r in outcome.results]
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return EXIT_OK if outcome.passed else EXIT_FAIL


def _report(result) -> None:
    from rich.console import Console
    from rich.markup import escape

    from lockstep.redact import scrub_text

    console = Console(stderr=False, highlight=False)
    mark = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
    # the summary may hold paths and values with brackets: never markup
    summary = escape(scrub_text(result.summary))
    console.print(f"{mark} {escape(result.name)}: {summary}", markup=True)
    if result.diagnosis and not result.passed:
        console.print(f"     likely cause: {scrub_text(result.diagnosis)}", markup=False)
    for line in (result.forensics or {}).get("lines", ()):
        console.print(f"     {scrub_text(line)}", markup=False)
