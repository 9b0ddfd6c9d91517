"""`lockstep check NAME CONFIG` (lockstep's own harness, any engine) and
`lockstep check NAME --script CMD` (a user's script): training invariant checks.

Exit codes: 0 every check passed, 1 a check failed, 2 bad input (including a script that
crashes or ignores the protocol), 3 a run timed out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from lockstep import extras
from lockstep.checks import registry
from lockstep.errors import EXIT_FAIL, EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run training invariant checks on a run config or on your own script",
        description="With CONFIG: train lockstep's reference job (any engine) in local ranks "
        "and check determinism, resume, clip, equivalence, world-size, accumulation or "
        "elastic. With --script: launch your training script through torchrun several times "
        "and compare the per-step metrics it logs with lockstep.track.log (determinism, "
        "resume, world-size, replicas; see README, 'Check your own training script').",
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
    if (args.config is None) == (args.script is None):
        raise UsageError("give either a run CONFIG or --script CMD (exactly one)")
    if args.nproc < 1 or (args.steps is not None and args.steps < 2):
        raise UsageError("--nproc must be at least 1 and --steps at least 2")
    sizes = _sizes(args.world_sizes)
    workdir = args.out or Path(tempfile.mkdtemp(prefix="lockstep-check-"))
    try:
        if args.config is not None:
            results = _harness_checks(args, sizes, workdir)
        else:
            results = _script_checks(args, sizes, workdir)
    except BaseException:
        if args.out is None and not any(workdir.iterdir()):
            workdir.rmdir()  # nothing ran; what did run keeps the log its error names
        raise
    if not all(r.passed for r in results):
        print(f"runs and logs: {workdir}")
    elif args.out is None:  # the runs' checkpoints and logs, in a folder of our own: gone
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        from lockstep.redact import redact_mapping

        report = [redact_mapping(r.to_dict()) for r in results]
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAIL


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


def _harness_checks(args: argparse.Namespace, sizes: list[int], workdir: Path) -> list:
    """Each check in its own launch (resume: two), the single-launch checks of `all` in one."""
    from lockstep.checks import elastic, harness
    from lockstep.checks.harness_ranks import rank_checks, run_ranks
    from lockstep.train.config import load_config

    overrides = list(args.overrides) + ([f"steps={args.steps}"] if args.steps else [])
    cfg = load_config(args.config, overrides)
    cfg.check(args.nproc)
    extras.require_config(f"lockstep check {args.config}", cfg, wandb=False)  # harness: no wandb
    if args.rtol is not None or args.atol is not None:
        raise UsageError("--rtol/--atol apply to --script; checks on a CONFIG use fixed tolerances")
    if args.launcher is not None or args.run_path:
        raise UsageError(
            "--launcher and --run-path apply to --script; a CONFIG's ranks start in-process"
        )
    if args.name in ("elastic", "all") and args.nproc < 2:
        raise UsageError("the elastic check kills rank 1: run it with --nproc 2 or more")
    nproc = args.nproc
    config = cfg.model_dump(mode="json")
    # Checks across world sizes keep the global batch of --nproc ranks.
    _, _, global_size = cfg.batch_shape(nproc)
    fixed = harness.derive(cfg, batch__global_size=global_size, batch__grad_accum=0)
    fixed_config = fixed.model_dump(mode="json")

    def ranks(names, n=nproc, config=config, **options):
        found = run_ranks(rank_checks, (names, config, str(workdir), options), n, cfg)
        for result in found:
            _report(result)
        return found

    names = registry.names() if args.name == "all" else (args.name,)
    shared = registry.shared(names) if args.name == "all" else ()
    results = ranks(list(shared)) if shared else []
    for name in names:
        launch = registry.CHECKS[name].launch
        if name in shared:
            continue
        if launch == "resume":
            half = max(1, cfg.steps // 2)
            other = args.resume_nproc or nproc
            fixed.check(other)
            ranks(["resume-reference"], config=fixed_config, half=half)
            results += ranks(["resume-compare"], n=other, config=fixed_config, half=half)
        elif launch == "world-sizes":
            for n in sizes:
                fixed.check(n)
            found = [r for n in sizes for r in ranks(["world-size"], n, fixed_config)]
            results.append(harness.combine("world-size", found))
        elif launch == "elastic":
            results.append(elastic.run(cfg, workdir / "elastic", nproc))
            _report(results[-1])
        else:
            results += ranks([name])
    return results


def _script_checks(args: argparse.Namespace, sizes: list[int], workdir: Path) -> list:
    from lockstep.checks import script

    supported = registry.names(script=True)
    if args.name not in (*supported, "all"):
        raise UsageError(
            f"check '{args.name}' needs a run CONFIG; --script supports {', '.join(supported)}"
        )
    if args.overrides or args.resume_nproc:
        raise UsageError("--set and --resume-nproc apply to a run CONFIG, not to --script")
    args.steps = args.steps or 8
    runner = script.ScriptRunner(
        args.script,
        workdir,
        timeout=args.timeout,
        launcher=args.launcher or "torchrun",
        run_path=args.run_path,
    )
    names = supported if args.name == "all" else (args.name,)
    if args.name == "all" and args.nproc < 2:
        names = tuple(n for n in names if n != "replicas")  # needs two ranks to compare
    exact = {"rtol": args.rtol or 0.0, "atol": args.atol or 0.0}
    results = []
    for name in names:
        if name == "determinism":
            result = script.check_determinism(runner, args.nproc, args.steps, **exact)
        elif name == "resume":
            result = script.check_resume(runner, args.nproc, args.steps, **exact)
        elif name == "replicas":
            result = script.check_replicas(runner, args.nproc, args.steps)
        else:
            tol = {
                "rtol": 1e-4 if args.rtol is None else args.rtol,
                "atol": 1e-6 if args.atol is None else args.atol,
            }
            result = script.check_world_size(runner, sizes, args.steps, **tol)
        results.append(result)
        _report(result)
    return results
