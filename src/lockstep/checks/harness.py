"""Training invariant checks on lockstep's own harness (`lockstep.train`), in-process.

Each check is collective: call it on every rank of a process group (a `lockstep check`
launch, a warm pytest pool) or in a single process; every rank returns the same
`CheckResult`. The trainings of a check run one after another in the same processes.

Tolerances: runs that must be identical (determinism, resume) are compared bitwise on CPU
and on GPU with `deterministic = true` (CUBLAS_WORKSPACE_CONFIG, deterministic algorithms
and NCCL_ALGO=Ring pinned); a GPU run with `deterministic = false` gets rtol 1e-3.
Comparisons across engines, world sizes, accumulation or against the unsharded reference
change the summation order, so they use `numeric_tolerance` (fp32 rtol 1e-5; bf16/fp16
rtol 2e-2).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lockstep.checks.diagnosis import REPLICA_QUANTITIES, replica_departed
from lockstep.checks.divergence_replay import investigate, reference_side, trainer_side
from lockstep.checks.reference import run_reference
from lockstep.checks.result import CheckResult, tolerance
from lockstep.checks.state import differences, first_tensor_difference, rows, snapshot
from lockstep.checks.trajectory import Divergence, first_divergence
from lockstep.errors import UsageError
from lockstep.module_digest import PASSES
from lockstep.train import checkpoint
from lockstep.train.config import RunConfig, from_dict
from lockstep.train.engines import ENGINES, engine_options
from lockstep.train.trainer import Trainer, run_training

FORCED_MAX_NORM = 1e-3
QUIET = {"logging.wandb": "disabled", "logging.progress": False}


def derive(cfg: RunConfig, **dotted: Any) -> RunConfig:
    """A copy of `cfg` with `section__key=value` overrides (`engine__name="fsdp"`)."""
    data = cfg.model_dump(mode="json")
    for key, value in {**QUIET, **dotted}.items():
        *parents, leaf = key.replace("__", ".").split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return from_dict(data, "check config")


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def exact_tolerance(cfg: RunConfig) -> tuple[float, float]:
    if cfg.resolved_device() == "cpu" or cfg.deterministic:
        return 0.0, 0.0
    return 1e-3, 1e-6


def numeric_tolerance(cfg: RunConfig) -> tuple[float, float]:
    return (1e-5, 1e-7) if cfg.precision == "fp32" else (2e-2, 1e-3)


def _investigated(result: CheckResult, sides, workdir: Path, last_step: int, rtol: float,
                  atol: float, **options) -> CheckResult:  # fmt: skip
    """A failed result with its replay's findings (`divergence_replay.investigate`): the first
    step, pass and module where the runs part, and for numeric checks noise or bug."""
    found = investigate(sides, workdir, result.divergence, last_step, rtol, atol, **options)
    result.forensics = found.to_dict()
    result.notes.extend(found.lines)
    if found.verdict is not None and found.verdict.kind in ("factor", "dependence", "noise"):
        result.diagnosis = f"{found.verdict.text}; {result.diagnosis}"
    return result


def _first_param_difference(want, got, rtol, atol) -> str | None:
    diff = first_tensor_difference(want, got, rtol, atol)
    return f"parameters differ: {diff}" if diff else None


# ----------------------------------------------------------------------------- determinism


def check_determinism(cfg: RunConfig, workdir: Path) -> CheckResult:
    """The same config twice: identical per-step loss and grad norm, identical final state."""
    rtol, atol = exact_tolerance(cfg)
    cfg = derive(cfg, checkpoint__at_end=False, checkpoint__every=0, checkpoint__resume="never")
    runs = [run_training(cfg, workdir / f"determinism-{i}", capture_state=True) for i in (1, 2)]
    div = first_divergence(rows(runs[0].steps), rows(runs[1].steps), rtol=rtol, atol=atol)
    if div is None:
        diff = _first_param_difference(runs[0].params, runs[1].params, rtol, atol)
        if diff is None:
            return CheckResult(
                "determinism",
                True,
                f"{cfg.engine.name}: two runs of {cfg.steps} steps on {world_size()} ranks agree "
                f"{tolerance(rtol, atol)}, final parameter digest {runs[0].param_digest[:16]}",
            )
        return _investigated(
            CheckResult(
                "determinism",
                False,
                f"{cfg.engine.name}: metrics agree but the final parameters differ ({diff})",
                diagnosis="a nondeterministic update: a kernel or reduction order that varies",
            ),
            {"run1": trainer_side(_replay_config(cfg)), "run2": trainer_side(_replay_config(cfg))},
            workdir / "determinism-replay",
            cfg.steps,
            rtol,
            atol,
        )
    return _investigated(
        CheckResult(
            "determinism",
            False,
            f"{cfg.engine.name}: two identical runs diverge at {div.describe('run1', 'run2')}",
            divergence=div,
            diagnosis="something is unseeded or nondeterministic: data order, init, dropout, or "
            "a nondeterministic kernel (set deterministic = true)",
        ),
        {"run1": trainer_side(_replay_config(cfg)), "run2": trainer_side(_replay_config(cfg))},
        workdir / "determinism-replay",
        cfg.steps,
        rtol,
        atol,
    )


# ---------------------------------------------------------------------------------- resume


def _resume_paths(workdir: Path, half: int) -> tuple[Path, Path]:
    ckpt = workdir / "resume" / "checkpoints"
    return ckpt, ckpt / f"step_{half:08d}"


def resume_reference(cfg: RunConfig, workdir: Path, half: int) -> None:
    """The straight run: 2N steps with a checkpoint at N; saves its state at N and at 2N."""
    ckpt, _ = _resume_paths(workdir, half)
    straight = derive(
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


def resume_compare(cfg: RunConfig, workdir: Path, half: int) -> CheckResult:
    """New processes: resume from the straight run's step-N checkpoint, compare state and
    the N steps after it with the straight run. At another world size (ddp/fsdp reshard
    through DCP) the comparison uses `numeric_tolerance` and skips the per-rank RNG."""
    ckpt, path = _resume_paths(workdir, half)
    rank = dist.get_rank() if dist.is_initialized() else 0
    saved = workdir / "resume" / f"straight-rank{rank}.pt"
    if not saved.exists():  # more ranks than the straight run had
        saved = workdir / "resume" / "straight-rank0.pt"
    straight = checkpoint.load_file(saved, map_location=None)
    same_world = straight["world_size"] == world_size()
    rtol, atol = exact_tolerance(cfg) if same_world else numeric_tolerance(cfg)
    resumed_cfg = derive(
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
    div = first_divergence(
        straight["steps"],
        rows(result.steps),
        steps=range(half + 1, 2 * half + 1),
        rtol=rtol,
        atol=atol,
    )
    param_atol = atol if same_world else 1e-2 * cfg.optimizer.lr
    end_diff = differences(straight["at_end"], at_end | {"RNG": None}, rtol, atol, param_atol)
    if not lost and div is None and not end_diff:
        return CheckResult(
            "resume",
            True,
            f"{where}: the loaded state and steps {half + 1}..{2 * half} match a straight run "
            f"{tolerance(rtol, atol)}, final parameters and optimizer state included",
        )
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
    straight_cfg = derive(cfg, steps=2 * half, checkpoint__resume="never",
                          checkpoint__dir=str(workdir / "resume" / "replay-ckpt"))  # fmt: skip
    return _investigated(
        CheckResult("resume", False, summary, divergence=div, diagnosis=diagnosis),
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


def check_resume(cfg: RunConfig, workdir: Path, half: int | None = None) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, a resume and N more steps.

    In one process group (a warm pool) the resume is a new `Trainer`; `lockstep check resume`
    runs `resume_compare` in a second launch, so the resume happens in new processes.
    """
    half = half or max(1, cfg.steps // 2)
    resume_reference(cfg, workdir, half)
    return resume_compare(cfg, workdir, half)


# ------------------------------------------------------------------------------------ clip


class PostClipNorm:
    """The global norm of the gradients the optimizer actually steps with (after clipping).

    A step pre-hook on the optimizer that applies the update (torch AdamW for ddp/fsdp, the
    one inside DeepSpeed's ZeRO optimizer, which sees this rank's flat fp32 partition) adds
    up this rank's part; `take()` combines the ranks' parts: replicated for ddp, disjoint
    shards for fsdp and ZeRO.
    """

    def __init__(self, engine, norm_type: float, device: torch.device):
        optimizer = engine.update_optimizer()
        self.sharded = engine.gradients_sharded
        self.inf = math.isinf(norm_type)
        self.device = device
        self.parts: list[float] = []
        optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                g = g.detach().float()
                self.parts.append(float(g.abs().max() if self.inf else g.pow(2).sum()))

    def take(self) -> float:
        local = max(self.parts, default=0.0) if self.inf else sum(self.parts)
        self.parts.clear()
        total = torch.tensor(local, dtype=torch.float64, device=self.device)
        if self.sharded and dist.is_initialized():
            dist.all_reduce(total, op=dist.ReduceOp.MAX if self.inf else dist.ReduceOp.SUM)
        return float(total) if self.inf else math.sqrt(float(total))


def check_clip(cfg: RunConfig, workdir: Path, steps: int = 2) -> CheckResult:
    """Pre-clip global norm and updated parameters equal the unsharded reference's.

    max_norm is forced to 1e-3 so that every step really clips; after clipping the norm the
    optimizer sees must be at most max_norm.
    """
    rtol, atol = numeric_tolerance(cfg)
    cfg = derive(
        cfg,
        steps=steps,
        clip__max_norm=FORCED_MAX_NORM,
        checkpoint__at_end=False,
        checkpoint__every=0,
        checkpoint__resume="never",
    )
    what = f"{cfg.engine.name}, norm type {cfg.clip.norm_type:g}"
    trainer = Trainer(cfg, workdir / "clip")
    try:
        probe = PostClipNorm(trainer.engine, cfg.clip.norm_type, trainer.ctx.device)
        got, post = [], []
        for _ in range(steps):
            got.append(rows([trainer.train_step()])[0])
            post.append(probe.take())
        params = trainer.engine.full_parameters()
    finally:
        trainer.close()
    ref = run_reference(cfg, world_size(), steps)
    for row, after in zip(got, post, strict=True):
        if not row["grad_norm"] > FORCED_MAX_NORM:
            return CheckResult(
                "clip",
                False,
                f"{what}: step {row['step']} norm {row['grad_norm']!r} is not "
                f"above max_norm {FORCED_MAX_NORM}, so clipping was not exercised",
            )
        if after > FORCED_MAX_NORM * (1 + 1e-4):
            return CheckResult(
                "clip",
                False,
                f"{what}: step {row['step']}: after clipping the optimizer saw a gradient norm "
                f"of {after!r} > max_norm {FORCED_MAX_NORM}",
                diagnosis="the clip coefficient was computed from a local (per-rank) norm "
                "or not applied to every shard",
            )
    div = first_divergence(ref.steps, got, metrics=("grad_norm", "loss"), rtol=rtol, atol=atol)
    if div is not None:
        return CheckResult(
            "clip",
            False,
            f"{what}: the engine and the unsharded reference diverge at "
            f"{div.describe('reference', cfg.engine.name)}",
            divergence=div,
            diagnosis="the pre-clip gradient norm is not the global norm (a local shard's, "
            "or reduced with the wrong operation)",
        )
    diff = _first_param_difference(ref.params, params, rtol, max(atol, 1e-6))
    if diff:
        return CheckResult(
            "clip",
            False,
            f"{what}: norms match the reference but after {steps} clipped steps the {diff}",
            diagnosis="the clip coefficient applied to the gradients differs from "
            "max_norm / global norm",
        )
    return CheckResult(
        "clip",
        True,
        f"{what}: pre-clip norms {got[0]['grad_norm']:.4g}.. match the unsharded reference "
        f"{tolerance(rtol, atol)}, post-clip norm <= {FORCED_MAX_NORM:g}, parameters match after "
        f"{steps} steps",
    )


# ----------------------------------------------------- equivalence, world size, accumulation


def _engine_config(cfg: RunConfig, engine: str) -> RunConfig:
    """cfg on another engine, dropping options only the original engine understands."""
    reset = {f"engine__{k}": cfg.engine.model_fields[k].default for k in engine_options()}
    return derive(cfg, engine__name=engine, **reset)


def _replay_config(cfg: RunConfig) -> RunConfig:
    return derive(cfg, checkpoint__at_end=False, checkpoint__every=0, checkpoint__resume="never")


def _trajectory(cfg: RunConfig, out: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    cfg = derive(cfg, checkpoint__at_end=False, checkpoint__every=0, checkpoint__resume="never")
    result = run_training(cfg, out, capture_state=True)
    return rows(result.steps), result.params


def _agree(
    name: str,
    runs: dict[str, tuple[list[dict], dict]],
    cfg: RunConfig,
    diagnosis: str,
    sides: dict | None = None,
    workdir: Path | None = None,
    passes: tuple[str, ...] = PASSES,
) -> CheckResult:
    """Every run against the first: loss, grad norm and lr per step, then final parameters.

    Parameters get an absolute tolerance of 1% of the learning rate: Adam divides by the
    root of the second moment, which turns rounding differences in near-zero gradients into
    visible fractions of a step.

    With `sides` (each run's `divergence_replay.Side`), a failure is replayed: the first
    module and pass where the runs part, and in float64 whether the difference is rounding
    noise (then the check passes, saying so) or a real dependence.
    """
    rtol, atol = numeric_tolerance(cfg)
    (base, (base_rows, base_params)), *others = runs.items()
    for label, (other_rows, other_params) in others:
        div = first_divergence(
            base_rows, other_rows, metrics=("loss", "grad_norm", "lr"), rtol=rtol, atol=atol
        )
        if div is not None:
            failed = CheckResult(
                name,
                False,
                f"{base} and {label} diverge at {div.describe(base, label)}",
                divergence=div,
                diagnosis=diagnosis,
            )
            if sides is None or workdir is None:
                return failed
            found = _investigated(
                failed,
                {base: sides[base], label: sides[label]},
                workdir / f"{name}-replay",
                len(base_rows),
                rtol,
                atol,
                passes=passes,
                float64=True,
                rows32=(base_rows, other_rows),
            )
            if found.forensics["verdict"] and found.forensics["verdict"]["kind"] == "noise":
                found.passed = True
                found.summary = (
                    f"{base} and {label} differ at {div.describe(base, label)} "
                    f"{tolerance(rtol, atol)}, which a float64 replay shows to be rounding noise"
                )
                found.diagnosis = None
                continue
            return found
        diff = _first_param_difference(base_params, other_params, rtol, 1e-2 * cfg.optimizer.lr)
        if diff:
            return CheckResult(
                name,
                False,
                f"{base} and {label}: metrics agree but the final {diff}",
                diagnosis=diagnosis,
            )
    steps = len(base_rows)
    return CheckResult(
        name, True, f"{', '.join(runs)} agree over {steps} steps {tolerance(rtol, atol)}"
    )


def check_equivalence(
    cfg: RunConfig, workdir: Path, engines: tuple[str, ...] = tuple(ENGINES)
) -> CheckResult:
    """ddp, fsdp and ZeRO-1/2/3 on the same config: loss and grad-norm curves agree."""
    configs = {e: _engine_config(cfg, e) for e in engines}
    runs = {e: _trajectory(c, workdir / f"equivalence-{e}") for e, c in configs.items()}
    return _agree(
        "equivalence",
        runs,
        cfg,
        "an engine computes a different loss, gradient reduction, clipping or update",
        sides={e: trainer_side(_replay_config(c)) for e, c in configs.items()},
        workdir=workdir,
    )


def check_world_size(cfg: RunConfig, workdir: Path) -> CheckResult:
    """This world size against the unsharded single-process reference on the same global
    batch; `lockstep check world-size` also compares launches of different sizes."""
    n = world_size()
    ref = run_reference(cfg, n)
    runs = {
        "1 process (unsharded)": (ref.steps, ref.params),
        f"{n} ranks": _trajectory(cfg, workdir / f"world-size-{n}"),
    }
    return _agree(
        "world-size",
        runs,
        cfg,
        "a rank-local computation: a norm or loss on a local shard, a batch that depends on "
        "the world size, or per-rank randomness",
        sides={
            "1 process (unsharded)": reference_side(cfg, n),
            f"{n} ranks": trainer_side(_replay_config(cfg)),
        },
        workdir=workdir,
        passes=("backward", "update"),  # the ranks' forward sees part of the batch
    )


def check_accumulation(cfg: RunConfig, workdir: Path) -> CheckResult:
    """micro batch × accumulation steps equals one large batch of the same global size."""
    micro, accum, _ = cfg.batch_shape(world_size())
    if accum == 1:
        if micro % 2:
            raise UsageError(
                f"accumulation check: batch.micro_size={micro} with no accumulation; use an "
                "even micro_size or set batch.grad_accum >= 2"
            )
        micro, accum = micro // 2, 2
    configs = {
        f"micro {micro} × accumulation {accum}": derive(
            cfg, batch__micro_size=micro, batch__grad_accum=accum, batch__global_size=0
        ),
        f"one batch of {micro * accum}": derive(
            cfg, batch__micro_size=micro * accum, batch__grad_accum=1, batch__global_size=0
        ),
    }
    outs = ("accumulation-micro", "accumulation-large")
    runs = {k: _trajectory(c, workdir / o) for (k, c), o in zip(configs.items(), outs, strict=True)}
    return _agree(
        "accumulation",
        runs,
        cfg,
        "accumulated gradients are not averaged like one batch (a loss not divided by the "
        "accumulation steps, or a reduction on every micro batch)",
        sides={k: trainer_side(_replay_config(c)) for k, c in configs.items()},
        workdir=workdir,
        passes=("backward", "update"),  # micro batches against one batch
    )


def combine(name: str, results: list[CheckResult]) -> CheckResult:
    """One result for several runs of a check: the first failure, else every summary."""
    for result in results:
        if not result.passed:
            return result
    return CheckResult(name, True, "; ".join(r.summary for r in results))


def check_clip_norm_types(cfg: RunConfig, workdir: Path) -> CheckResult:
    """`check_clip` for norm type 2 and, on ddp and fsdp, inf."""
    norms = ENGINES[cfg.engine.name].norm_types
    return combine(
        "clip", [check_clip(derive(cfg, clip__norm_type=n), workdir / f"norm-{n:g}") for n in norms]
    )


# -------------------------------------------------------------------------------- replicas


def check_replicas(cfg: RunConfig, workdir: Path) -> CheckResult:
    """After every step each rank's loss, gradient norm and digests of the parameters and
    buffers it holds (`lockstep.track.digests` of the engine's module: full replicas under
    ddp and zero1/2; under fsdp and zero3 each rank's parameters are shards, left out, and
    the buffers remain) agree exactly with rank 0's."""
    from lockstep.track import digests

    cfg = derive(cfg, checkpoint__at_end=False, checkpoint__every=0, checkpoint__resume="never")
    trainer = Trainer(cfg, workdir / "replicas")
    ranks = world_size()
    found = None
    try:
        for _ in range(cfg.steps):
            m = trainer.train_step()
            mine = {"loss": m.loss, "grad_norm": m.grad_norm, **digests(trainer.engine.module)}
            every: list = [None] * ranks
            if dist.is_initialized():
                dist.all_gather_object(every, mine)
            else:
                every = [mine]
            for quantity in REPLICA_QUANTITIES:
                bad = [r for r in range(1, ranks) if every[r][quantity] != every[0][quantity]]
                if bad and found is None:
                    found = (m.step, quantity, bad[0], every[0][quantity], every[bad[0]][quantity])
            if found:
                break
    finally:
        trainer.close()
    if found is None:
        return CheckResult(
            "replicas",
            True,
            f"{cfg.engine.name}: {ranks} ranks agree on loss, grad norm, parameter and buffer "
            f"digests after each of {cfg.steps} steps",
        )
    step, quantity, rank, want, got = found
    return CheckResult(
        "replicas",
        False,
        f"{cfg.engine.name}: rank {rank} departed from rank 0 at step {step}: {quantity} "
        f"rank0={want!r} rank{rank}={got!r}",
        divergence=Divergence(step, quantity, want, got),
        diagnosis=replica_departed(quantity, step, rank),
        rank=rank,
    )
