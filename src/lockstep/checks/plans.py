"""`lockstep check` from its command line (`Request`) to its exit code: launches of the
reference job on a CONFIG (`Launches`), runs of a script with --script.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from lockstep import job_options
from lockstep.checks import registry
from lockstep.checks.result import CheckResult, exit_code
from lockstep.errors import UsageError
from lockstep.flags import flag
from lockstep.inputs import positive_int
from lockstep.job_options import JobOptions, first_step_default

Show = Callable[[CheckResult], None]
SCRIPT_STEPS = 8  # a script's steps per run without --steps


@dataclass(frozen=True, kw_only=True)
class Request(JobOptions):
    """A `lockstep check` command line, as parsed."""

    script_steps: ClassVar[int] = SCRIPT_STEPS
    steps_note: ClassVar[str] = "; resume stops at half"

    name: str = flag(choices=lambda: [*registry.names(), "all"], order=-1, help="the check to run")
    launcher: str | None = flag(
        "--launcher", choices=("torchrun", "deepspeed"), default=None, shown="torchrun",
        help="with --script: launch it through torchrun or the deepspeed CLI, which passes "
        "--local_rank",
    )  # fmt: skip
    world_sizes: str = flag(
        "--world-sizes", default="1,2", metavar="N,N",
        help="world sizes compared by the world-size check",
    )  # fmt: skip
    resume_nproc: int | None = flag(
        "--resume-nproc", type=positive_int, default=None,
        help="with CONFIG: resume on this many ranks instead of --nproc (ddp/fsdp reshard)",
    )  # fmt: skip
    first_step_timeout: float | None = job_options.first_step_timeout()
    rtol: float | None = flag(
        "--rtol", type=float, default=None, shown=lambda: default_tolerances(0),
        help="with --script: relative tolerance ({default}); world-size judges a difference "
        "beyond it by a float64 replay and the noise floor",
    )  # fmt: skip
    atol: float | None = flag(
        "--atol", type=float, default=None, shown=lambda: default_tolerances(1),
        help="with --script: absolute tolerance",
    )  # fmt: skip
    out: Path | None = flag(
        "--out", type=Path, default=None,
        shown="a temporary one, removed when all pass",
        help="folder for runs and logs ({default}); with --script, the runs an earlier check "
        "left there are removed first",
    )  # fmt: skip
    json: Path | None = flag(
        "--json", type=Path, default=None, metavar="PATH", help="write results here"
    )


def default_tolerances(index: int) -> str:
    """--rtol's (`index` 0) or --atol's (1) default per check, read from the registry so that
    the help cannot drift from what runs."""
    by_value: dict[str, list[str]] = {}
    exact = []
    for name in registry.names(script=True):
        tolerance = registry.CHECKS[name].script.tolerance
        if tolerance is None:
            exact.append(name)
        else:
            by_value.setdefault(f"{tolerance[index]:g}", []).append(name)
    parts = [f"{value} for {', '.join(names)}" for value, names in by_value.items()]
    return "; ".join(parts + [f"{name} always compares exactly" for name in exact])


@dataclass(frozen=True)
class Outcome:
    results: list[CheckResult]
    workdir: Path  # the runs and logs

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.verdict == "pass" for r in self.results)


def check(request: Request) -> int:
    """`lockstep check`: run what `request` asks, then the step summary and the --json report."""
    from lockstep.inputs import writable

    json_path = request.json
    writable(json_path, "--json")  # before the runs, not after them
    outcome = run(request, show)
    if not outcome.passed:
        print(f"runs and logs: {outcome.workdir}")
    from lockstep.checks.divergence import markdown
    from lockstep.redact import scrub_text
    from lockstep.summary_md import step_summary

    if section := markdown(outcome.results):
        step_summary(scrub_text(section))
    if json_path:
        from lockstep.redact import redact_mapping

        report = [redact_mapping(r.to_dict()) for r in outcome.results]
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    return exit_code(outcome.results)


def show(result) -> None:
    """One result, as it comes: its verdict, summary, likely cause and forensics."""
    from rich.markup import escape

    from lockstep.redact import scrub_text
    from lockstep.terminal import console as make_console

    console = make_console()
    mark = {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]"}.get(
        result.verdict, "[yellow]NOT JUDGED[/yellow]"
    )
    # the summary may hold paths and values with brackets: never markup
    summary = escape(scrub_text(result.summary))
    console.print(f"{mark} {escape(result.name)}: {summary}", markup=True)
    if result.diagnosis and result.verdict == "fail":
        console.print(f"     likely cause: {scrub_text(result.diagnosis)}", markup=False)
    for line in (result.forensics or {}).get("lines", ()):
        console.print(f"     {scrub_text(line)}", markup=False)


def run(request: Request, show: Show) -> Outcome:
    if (request.config is None) == (request.script is None):
        raise UsageError("give either a run CONFIG or --script CMD (exactly one)")
    if request.nproc < 1 or (request.steps is not None and request.steps < 2):
        raise UsageError("--nproc must be at least 1 and --steps at least 2")
    sizes = parse_world_sizes(request.world_sizes)
    workdir = request.out or Path(tempfile.mkdtemp(prefix="lockstep-check-"))
    try:
        if request.config is not None:
            results = on_config(request, sizes, workdir, show)
        else:
            results = on_script(request, sizes, workdir, show)
    except BaseException:
        if request.out is None and not any(workdir.iterdir()):
            workdir.rmdir()  # nothing ran; what did run keeps the log its error names
        raise
    outcome = Outcome(results, workdir)
    if outcome.passed and request.out is None:  # checkpoints and logs in a folder of ours
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def parse_world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or any(n < 1 for n in sizes):
        raise UsageError(f"--world-sizes wants two or more positive integers, got {text!r}")
    return sizes


# ------------------------------------------------------------------------------- a CONFIG


class Launches:
    """Launches of the reference job for one request: `ranks` runs rank-side functions on N
    local ranks; checks across world sizes keep --nproc's global batch (`fixed`)."""

    def __init__(self, cfg, request: Request, sizes: list[int], workdir: Path, show: Show):
        from lockstep.checks.harness import check_config

        self.cfg, self.nproc, self.sizes = cfg, request.nproc, sizes
        self.resume_nproc = request.resume_nproc
        self.workdir, self.show = workdir, show
        self.timeout = request.timeout
        self.config = cfg.model_dump(mode="json")
        _, _, global_size = cfg.batch_shape(self.nproc)
        self.fixed = check_config(cfg, batch__global_size=global_size, batch__grad_accum=0)
        self.fixed_config = self.fixed.model_dump(mode="json")

    def ranks(self, calls: list[registry.Function], n: int | None = None, config=None,
              **options) -> list[CheckResult]:  # fmt: skip
        from lockstep.checks.harness_ranks import rank_calls, run_ranks
        from lockstep.launch.progress import watching

        config = self.config if config is None else config
        args = (calls, config, str(self.workdir), options)
        names = ", ".join(dict.fromkeys(call.module for call in calls))
        with watching(f"{names} on {n or self.nproc} ranks", self.workdir, self.cfg.steps):
            found = run_ranks(rank_calls, args, n or self.nproc, self.cfg, timeout=self.timeout,
                              forensics=self.workdir / "flight-recorder",
                              preload=[call.path for call in calls])  # fmt: skip
        for result in found:
            self.show(result)
        return found


def on_config(request: Request, sizes: list[int], workdir: Path, show: Show) -> list:
    """Each check in its own launch (or its plan's), the checks of `all` without a plan in one."""
    from lockstep.train.config import load_config, require_config

    overrides = list(request.overrides) + ([f"steps={request.steps}"] if request.steps else [])
    cfg = load_config(request.config, overrides)
    cfg.check(request.nproc)
    require_config(f"lockstep check {request.config}", cfg, wandb=False)  # no wandb
    if request.rtol is not None or request.atol is not None:
        raise UsageError("--rtol/--atol apply to --script; checks on a CONFIG use fixed tolerances")
    if request.launcher is not None or request.run_path or request.first_step_timeout:
        raise UsageError(
            "--launcher, --run-path and --first-step-timeout apply to --script; a CONFIG's "
            "ranks start in-process"
        )
    names = registry.names() if request.name == "all" else (request.name,)
    for name in names:
        registry.CHECKS[name].require_ranks(request.nproc)
    launches = Launches(cfg, request, sizes, workdir, show)
    shared = registry.shared(names) if request.name == "all" else ()
    results = launches.ranks([registry.CHECKS[n].rank for n in shared]) if shared else []
    for name in names:
        check = registry.CHECKS[name]
        if name in shared:
            continue
        if check.plan is not None:
            results += check.plan(launches, check)
        else:
            results += launches.ranks([check.rank])
    return results


# ------------------------------------------------------------------------------- a script


def on_script(request: Request, sizes: list[int], workdir: Path, show: Show) -> list:
    from lockstep.checks.script_runs import Runs, ScriptRunner

    supported = registry.names(script=True)
    if request.name not in (*supported, "all"):
        raise UsageError(
            f"check '{request.name}' needs a run CONFIG; --script supports {', '.join(supported)}"
        )
    if request.overrides or request.resume_nproc:
        raise UsageError("--set and --resume-nproc apply to a run CONFIG, not to --script")
    runner = ScriptRunner(
        request.script,
        workdir,
        timeout=request.timeout,
        launcher=request.launcher or "torchrun",
        run_path=request.run_path,
        first_step_timeout=request.first_step_timeout or first_step_default(),
    )
    names = supported if request.name == "all" else (request.name,)
    if request.name == "all":  # e.g. replicas needs two ranks to compare
        names = tuple(n for n in names if request.nproc >= registry.CHECKS[n].script.min_nproc)
    asked = Runs(request.nproc, request.steps or SCRIPT_STEPS, sizes)
    results = []
    for name in names:
        side = registry.CHECKS[name].script
        result = side.run(runner, asked, **side.tolerances(request.rtol, request.atol))
        results.append(result)
        show(result)
    return results
