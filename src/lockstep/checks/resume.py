"""The resume check: N steps, a checkpoint, a resume and N more steps match 2N straight steps,
on the reference job (`resume_reference`, `plan`, `resume_compare`) or a user's script
(`check_script`). Design: docs/design/checks.md."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

from lockstep.checks import registry
from lockstep.checks.divergence_replay import investigated, trainer_side
from lockstep.checks.harness import check_config, exact_tolerance, numeric_tolerance, world_size
from lockstep.checks.result import CheckResult, skipped_notes, tolerance, unsound
from lockstep.checks.script_runs import Runs, ScriptRunner, require_steps
from lockstep.checks.state import differences, rows, snapshot
from lockstep.checks.trajectory import Divergence, by_step, first_divergence
from lockstep.errors import UsageError
from lockstep.module_digest import PASSES
from lockstep.redact import scrub_text
from lockstep.train import checkpoint
from lockstep.train.config import RunConfig
from lockstep.train.trainer import Trainer


def _resume_paths(workdir: Path, half: int) -> tuple[Path, Path]:
    ckpt = workdir / "resume" / "checkpoints"
    return ckpt, ckpt / f"step_{half:08d}"


def resume_reference(cfg: RunConfig, workdir: Path, half: int) -> None:
    """The straight run: 2N steps with a checkpoint at N; saves its state at N and at 2N."""
    ckpt, _ = _resume_paths(workdir, half)
    straight = check_config(
        cfg,
        steps=2 * half,
        checkpoint__every=half,
        checkpoint__at_end=False,
        checkpoint__keep=2,
        checkpoint__resume="never",
        checkpoint__dir=str(ckpt),
    )
    trainer = Trainer(straight, workdir / "resume" / "straight")
    try:
        first = trainer.train(stop_at=half).steps
        at_half = snapshot(trainer)
        result = trainer.train()
        at_end = snapshot(trainer)
    finally:
        trainer.close()
    record = {
        "steps": rows(first + result.steps),
        "at_half": at_half,
        "at_end": at_end,
        "world_size": world_size(),
    }
    torch.save(record, workdir / "resume" / f"straight-rank{trainer.rank}.pt")


def _straight_record(workdir: Path) -> dict:
    rank = dist.get_rank() if dist.is_initialized() else 0
    saved = workdir / "resume" / f"straight-rank{rank}.pt"
    if not saved.exists():  # more ranks than the straight run had
        saved = workdir / "resume" / "straight-rank0.pt"
    return checkpoint.load_file(saved, map_location=None)


def resume_compare(cfg: RunConfig, workdir: Path, half: int) -> CheckResult:
    """New processes: resume from the straight run's step-N checkpoint, compare state and
    the N steps after it with the straight run. At another world size (ddp/fsdp reshard
    through DCP) the comparison uses `numeric_tolerance` and skips the per-rank RNG."""
    ckpt, path = _resume_paths(workdir, half)
    straight = _straight_record(workdir)
    same_world = straight["world_size"] == world_size()
    rtol, atol = exact_tolerance(cfg) if same_world else numeric_tolerance(cfg)
    resumed_cfg = check_config(
        cfg,
        steps=2 * half,
        checkpoint__at_end=False,
        checkpoint__every=0,
        checkpoint__resume=str(path),
        checkpoint__dir=str(ckpt),
    )
    trainer = Trainer(resumed_cfg, workdir / "resume" / f"resumed-{world_size()}")
    try:
        loaded = snapshot(trainer)
        if not same_world:
            loaded["RNG"] = None
        lost = differences(straight["at_half"], loaded, rtol, atol)
        result = trainer.train()
        at_end = snapshot(trainer)
    finally:
        trainer.close()
    where = f"{cfg.engine.name}, resume at step {half}" + (
        "" if same_world else f" on {world_size()} ranks"
    )
    steps_after = range(half + 1, 2 * half + 1)
    logged = {"straight": straight["steps"], "resumed": rows(result.steps)}
    bad = unsound("resume", logged)
    if bad is not None:
        bad.summary = f"{where}: {bad.summary}"
        return bad
    div = first_divergence(logged["straight"], logged["resumed"], steps=steps_after,
                           rtol=rtol, atol=atol)  # fmt: skip
    param_atol = atol if same_world else 1e-2 * cfg.optimizer.lr
    end_diff = differences(straight["at_end"], at_end | {"RNG": None}, rtol, atol, param_atol)
    if not lost and div is None and not end_diff:
        return CheckResult(
            "resume",
            True,
            f"{where}: the loaded state and steps {half + 1}..{2 * half} match a straight run "
            f"{tolerance(rtol, atol)}, final parameters and optimizer state included",
            notes=skipped_notes(logged),
        )
    straight_cfg = check_config(cfg, steps=2 * half, checkpoint__resume="never",
                                checkpoint__dir=str(workdir / "resume" / "replay-ckpt"))  # fmt: skip
    return investigated(
        _failed(where, lost, div, end_diff),
        {
            "straight": trainer_side(straight_cfg, record_from=half + 1),
            "resumed": trainer_side(resumed_cfg, record_from=half + 1),
        },
        workdir / "resume-replay",
        2 * half,
        rtol,
        atol,
        first_step=half + 1,
        passes=PASSES if same_world else ("backward", "update"),
    )


def _failed(where: str, lost: dict, div: Divergence | None, end_diff: dict) -> CheckResult:
    """The failed result: what the resume did not restore, else where the steps after it part,
    else the state that differs at the end."""
    if lost:
        diagnosis = "not restored by the resume: " + "; ".join(
            f"{part} ({why})" for part, why in lost.items()
        )
    elif div is not None:
        diagnosis = "the loaded state matches but the steps after it diverge"
    else:
        diagnosis = "after the resumed steps: " + "; ".join(
            f"{part} ({why})" for part, why in end_diff.items()
        )
    summary = (
        f"{where}: the resumed run diverges at {div.describe('straight', 'resumed')}"
        if div is not None
        else f"{where}: the metrics match but the state differs"
    )
    return CheckResult("resume", False, summary, divergence=div, diagnosis=diagnosis)


def check_resume(cfg: RunConfig, workdir: Path, half: int | None = None) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, a resume and N more steps.

    In one process group (a warm pool) the resume is a new `Trainer`; `lockstep check resume`
    runs `resume_compare` in a second launch (`plan`), so the resume happens in new processes.
    """
    half = half or max(1, cfg.steps // 2)
    resume_reference(cfg, workdir, half)
    return resume_compare(cfg, workdir, half)


def plan(launches, check: registry.Check) -> list[CheckResult]:
    """A straight run that checkpoints at half, then new processes (maybe another world size,
    --resume-nproc) that resume from it (`plans.Launches`)."""
    half = max(1, launches.cfg.steps // 2)
    other = launches.resume_nproc or launches.nproc
    launches.fixed.check(other)
    config = launches.fixed_config
    here = registry.Function("resume", "resume_reference")
    launches.ranks([here], config=config, half=half)
    return launches.ranks([registry.Function("resume", "resume_compare")], other, config,
                          half=half)  # fmt: skip


# ------------------------------------------------------------------------------ a script


def check_script(runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, new processes and a resume to 2N.
    The script may checkpoint at any step k <= N; the resumed run's first logged step k+1
    says where it resumed, and steps k+1..2N are compared. A resume that starts at step 1
    (nothing loaded), past N+1, or that leaves out a step fails."""
    nproc, steps = asked.nproc, asked.steps
    half = max(1, steps // 2)
    total = 2 * half
    straight = runner.run("resume-straight", nproc=nproc, max_steps=total)
    ckpt = runner.workdir / "resume-checkpoints"
    first_half = runner.run("resume-first-half", nproc=nproc, max_steps=half, checkpoint_dir=ckpt)
    if not ckpt.is_dir() or not any(ckpt.iterdir()):
        raise UsageError(
            f"the script left no checkpoint in LOCKSTEP_CHECKPOINT_DIR ({ckpt}) within "
            f"LOCKSTEP_MAX_STEPS={half} steps; it must save one at or before its last step"
        )
    resumed = runner.run(
        "resume-second-half", nproc=nproc, max_steps=total, checkpoint_dir=ckpt, resume=True
    )
    halves = ("resume-first-half", "resume-second-half")
    for line in resume_warnings({name: Path(runner.logs[name]) for name in halves}):
        runner.note(line)
    require_steps(straight, total, "resume-straight")
    bad = runner.unsound("resume", {"straight": straight, "resumed": resumed})
    if bad is not None:
        return bad
    logged = sorted(by_step(resumed))
    stopped = max(half, runner.last_logged.get("resume-first-half", half))  # overshoot
    wrong = _wrong_start(logged, half, stopped, total)
    if wrong is not None:
        summary, diagnosis, div = wrong
        if logged and logged[0] == 1:
            diagnosis = restart_cause(straight, resumed, stopped, rtol, atol)
        elif logged:
            diagnosis = _shift_cause(straight, resumed, rtol, atol) or diagnosis
        return _script_failed(runner, summary, diagnosis, div)
    first = logged[0]
    where = f"a resume at step {first - 1}"
    if first - 1 < half:
        where += f" (its latest checkpoint; the first run stopped at {half})"
    elif first - 1 > half:
        where += f" (the first run went past LOCKSTEP_MAX_STEPS={half})"
    div = first_divergence(straight, resumed, steps=range(first, total + 1), rtol=rtol, atol=atol)
    if div is None:
        return CheckResult(
            "resume",
            True,
            f"steps {first}..{total} after {where} match a straight run {tolerance(rtol, atol)}",
            logs=runner.logs,
            notes=runner.take_notes() + skipped_notes({"straight": straight, "resumed": resumed}),
        )
    return _script_failed(
        runner,
        f"the resumed run diverges at {div.describe('straight', 'resumed')}",
        _shift_cause(straight, resumed, rtol, atol)
        or diagnose_resume(div, straight, first_half, resumed, rtol, atol),
        div,
    )


def _script_failed(runner: ScriptRunner, summary: str, diagnosis: str,
                   div: Divergence | None = None) -> CheckResult:  # fmt: skip
    said = [n.split(INEXACT, 1)[1] for n in runner.notes if INEXACT in n]  # the script knew
    if not said or UNTOLD not in diagnosis:  # what it said replaces the metrics' guess
        said.append(diagnosis)
    return CheckResult("resume", False, summary, divergence=div, diagnosis="; and ".join(said),
                       logs=runner.logs, notes=runner.take_notes())  # fmt: skip


# What a script or its library prints when a resume will not be exact (docs/design/checks.md)
INEXACT = "warning: resuming inexactly: "  # integrations.lightning: a part it did not restore
UNTOLD = "the RNG state or data position was not restored"
RESUME_WARNING = re.compile(
    r"resuming from a checkpoint that ended|not resumable|reproducibility is not guaranteed|"
    r"set back the RNG states|could not load random states|(missing|unexpected) keys in the "
    r"checkpoint|resuming training from a checkpoint trained with|warn\w*:.*resum",
    re.IGNORECASE,
)


def resume_warnings(logs: dict[str, Path], most: int = 3) -> list[str]:
    """The resumability warnings in the runs' `logs` ({run: run.log}), one line each, scrubbed:
    once however many ranks printed them (torchrun's `[rank0]:` and a warning's folders left
    out), at most `most`."""
    found: dict[str, str] = {}
    for name, log in logs.items():
        for line in (log.read_text(errors="replace") if log.is_file() else "").splitlines():
            if RESUME_WARNING.search(line):
                line = re.sub(r"^\[\w+\]:\s*", "", line.strip())
                line = scrub_text(re.sub(r"^\S*/(?=[^/\s]+\.py:\d+:)", "", line))
                found.setdefault(line if len(line) <= 400 else line[:399] + "…", name)
    return [f"run '{name}' warned: {line}" for line, name in list(found.items())[:most]]


def _wrong_start(
    logged: list[int], half: int, stopped: int, total: int
) -> tuple[str, str, Divergence | None] | None:
    """(summary, diagnosis, divergence) when the resumed run's steps (`logged`) do not start
    right after a checkpoint of the first run (which stopped at `stopped`) and run on to
    `total` without a gap; None when they do."""
    if not logged:
        return "the resumed run logged no step", "the resumed run did not train", None
    first = logged[0]
    if first == 1:
        return (
            f"the resumed run started again at step 1 (the first run stopped at {half})",
            "no checkpoint was loaded: is LOCKSTEP_RESUME=1 honoured, and does the step "
            "counter come from the checkpoint?",
            Divergence(1, "step", None, 1),
        )
    if first > stopped + 1:
        return (
            f"the resumed run starts at step {first}, after the first run's last step "
            f"{stopped}: "
            + (
                f"step {first - 1} was skipped"
                if first - 1 == stopped + 1
                else f"steps {stopped + 1}..{first - 1} were skipped"
            ),
            "the step counter or data position restored past the checkpoint "
            "(an off-by-one when saving or loading the step?)",
            Divergence(stopped + 1, "step", stopped + 1, None),
        )
    gaps = sorted(set(range(first, total + 1)) - set(logged))
    if gaps:
        return (
            f"the resumed run (from step {first}) skipped step {gaps[0]}",
            "the resumed run left out a step: the step counter advances twice, or a step "
            "is not logged",
            Divergence(gaps[0], "step", gaps[0], None),
        )
    return None


DIGESTS = ("param_digest", "buffer_digest")  # with model= in track.log (`track.digests`)
LATER = "the data order or RNG of a later step (a new epoch's shuffle) was not restored"


def diagnose_resume(div: Divergence, straight: list[dict], first_half: list[dict],
                    resumed: list[dict], rtol: float, atol: float) -> str:  # fmt: skip
    """The causes the logged metrics show for a resumed run that parts from the straight run
    at `div` (alternatives within one most likely first), then the evidence that decided.
    The resumed run's first step r reads the loaded weights (`param_digest_in`), its batch
    and the RNG: its loss and grad norm show them, before any update. The update adds the LR
    and the optimizer state; the `param_digest` logged after it shows the weights they made."""
    first, last = min(by_step(resumed)), max(by_step(straight))
    digests = DIGESTS if rtol == atol == 0 else ()  # exact: judged only where the metrics are
    saved = range(1, min(first - 1, max(by_step(first_half), default=0)) + 1)
    metrics = ("loss", "grad_norm", "lr", *digests)
    before = first_divergence(straight, first_half, metrics, saved, rtol, atol)
    if before is not None:
        return (
            "the state saved is not the straight run's: the first run parts from it before its "
            f"checkpoint, at {before.describe('straight', 'first run')}; the training depends "
            "on LOCKSTEP_MAX_STEPS (a schedule or data sized by it) or is not deterministic"
        )
    want = by_step(straight)[first]
    weighed = "param_digest" in digests and "param_digest" in want  # step r's update is seen
    causes, evidence = [], []
    if saved and weighed:
        evidence.append(f"the first run's weights up to step {saved[-1]} are the straight run's "
                        "(param_digest)")  # fmt: skip
    lr = first_divergence(straight, resumed, ("lr",), range(first, last + 1), rtol, atol)
    if "lr" not in want:
        evidence.append("the script logs no LR: the LR schedule is not judged")
    elif lr is not None:
        causes.append("the LR schedule was not restored")
        evidence.append(f"lr differs at step {lr.step}")
    else:
        evidence.append(f"lr agrees at steps {first}..{last}: not the LR schedule")
    at_first = range(first, first + 1)
    read = first_divergence(straight, resumed, ("loss", "grad_norm"), at_first, rtol, atol)
    loaded = (by_step(resumed)[first].get("param_digest_in"),
              by_step(straight).get(first - 1, {}).get("param_digest"))  # fmt: skip
    if read and None not in loaded and loaded[0] != loaded[1]:
        causes.append("the model weights were not restored")
        evidence.append(f"step {first} entered its forward with other weights than the straight "
                        f"run's after step {first - 1} (param_digest_in)")  # fmt: skip
    elif read:
        known = None not in loaded  # the weights it entered with are the straight run's
        causes.append(UNTOLD + " (the metrics cannot tell them apart)" + (
                      "" if known else ", else the model weights were "
                      "not loaded"))  # fmt: skip
        evidence.append(f"step {first}, the first after the resume, differs in {read.metric} "
                        "before its update: " + ("its weights are the straight run's "
                        "(param_digest_in), so its batch or RNG" if known else
                        "its weights, batch or RNG"))  # fmt: skip
    else:
        evidence.append(f"step {first}, the first after the resume, agrees in loss and "
                        "grad_norm: its weights, batch and RNG were restored")  # fmt: skip
    if read or (lr is not None and lr.step == first):
        evidence.append(f"the optimizer state is not judged: step {first}'s update differs anyway")
    elif weighed and first_divergence(straight, resumed, ("param_digest",), at_first):
        causes.append("the optimizer state was not restored" + ("" if "lr" in want else
                      ", or the LR schedule"))  # fmt: skip
        evidence.append(f"the weights after step {first}'s update differ (param_digest)")
    elif weighed and not causes:
        causes.append(LATER)
        evidence.append(f"the weights after step {first}'s update agree (param_digest): the "
                        f"optimizer state was restored; the runs part at step {div.step}")  # fmt: skip
    elif not causes:  # the optimizer shows at step r+1 first, without a digest
        optimizer = "the optimizer state was not restored"
        causes.append(f"{optimizer}, else {LATER}" if div.step == first + 1 else
                      f"{LATER}, else {optimizer}")  # fmt: skip
        evidence.append(f"no param_digest shows step {first}'s update (pass model= to "
                        f"track.log); the runs part at step {div.step}")  # fmt: skip
    return "; and ".join(causes) + " [evidence: " + "; ".join(evidence) + "]"


def restart_cause(
    straight: list[dict], resumed: list[dict], stopped: int, rtol: float, atol: float
) -> str:
    """Why a resumed run started again at step 1, from its first steps' metrics: they are
    the straight run's steps 1.. (nothing was loaded), or its steps k+1.. (the state of step
    k was loaded, the step counter was not), or neither (some state was loaded)."""
    for k in range(stopped + 1):
        if _matches_shifted(straight, resumed, k, rtol, atol):
            if k == 0:
                return (
                    "no checkpoint was loaded: its step 1 is the straight run's step 1 "
                    "(is LOCKSTEP_RESUME=1 honoured?)"
                )
            return (
                f"the checkpoint of step {k} was loaded (its step 1 is the straight run's "
                f"step {k + 1}) but the step counter was not: it must come from the checkpoint"
            )
    return (
        "the step counter was not restored (it starts again at 1), and the steps after it "
        "match neither a fresh start nor the straight run from the checkpoint: some state "
        "(model or optimizer) was loaded, some not"
    )


def _shift_cause(straight: list[dict], resumed: list[dict], rtol: float, atol: float) -> str:
    """A resume that replays the straight run one step out of place, named as such, or ""."""
    first = min(by_step(resumed))
    if _matches_shifted(straight, resumed, first, rtol, atol, shift=1):
        return (
            f"the resumed run is one step late: its step k is the straight run's step k+1 "
            f"(its step {first} is straight step {first + 1}): the step counter was restored "
            "one lower than the state it goes with (saved before its increment?)"
        )
    if _matches_shifted(straight, resumed, first, rtol, atol, shift=-1):
        return (
            f"the resumed run is one step early: its step k is the straight run's step k-1 "
            f"(its step {first} is straight step {first - 1}): the step counter was restored "
            "one higher than the state it goes with (an off-by-one when saving or loading)"
        )
    return ""


def _matches_shifted(straight: list[dict], resumed: list[dict], first: int, rtol: float,
                     atol: float, shift: int | None = None) -> bool:  # fmt: skip
    """Whether resumed step s matches straight step s + `shift` for every step both have,
    from resumed step `first` (`shift` None: resumed step s is straight step s + `first`,
    for a run that restarted at 1 from the state of step `first`)."""
    offset = first if shift is None else shift
    start = 1 if shift is None else first
    moved = [dict(r, step=int(r["step"]) - offset) for r in straight]
    steps = sorted(set(by_step(moved)) & set(by_step(resumed)))
    steps = [s for s in steps if s >= start]
    if not steps:
        return False
    span = range(steps[0], steps[-1] + 1)
    return first_divergence(moved, resumed, steps=span, rtol=rtol, atol=atol) is None
