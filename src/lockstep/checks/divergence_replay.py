"""A failed check's replay on the reference job: both runs again, recorded and compared, for the
numeric checks in float64 too. Collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lockstep.checks import divergence as dv
from lockstep.checks.harness import check_config
from lockstep.checks.result import CheckResult
from lockstep.checks.trajectory import Divergence
from lockstep.module_digest import PASSES, Recorder, StepRecord

# A side of a comparison: record(steps, dtype, out) -> (records, rows)
Side = Callable[[int, "torch.dtype | None", Path], tuple[list[StepRecord], list[dict]]]


def trainer_side(cfg, record_from: int = 1) -> Side:
    """cfg's run on the engine (a resume config resumes), recorded from step `record_from`."""

    def record(steps, dtype, out):
        from lockstep.train.engine_table import ENGINES
        from lockstep.train.trainer import Trainer

        if dtype is not None and ENGINES[cfg.engine.name].zero_stage is not None:
            # every rank raises alike, before any collective
            raise NotImplementedError(f"{cfg.engine.name} keeps fp32 master weights")
        run = check_config(cfg, checkpoint__at_end=False, checkpoint__every=0)
        ctx = dv.default_dtype(dtype) if dtype is not None else contextlib.nullcontext()
        with ctx:
            trainer = Trainer(run, out)
            recorder = None
            try:
                recorder = Recorder(trainer.engine.module, trainer.engine.update_optimizer())
                rows = []
                while trainer.step < steps:
                    recorder.on = trainer.step + 1 >= record_from
                    m = trainer.train_step()
                    rows.append(asdict(m))
                    params = trainer.engine.full_parameters() if recorder.on else None
                    recorder.end_step(m.step, m.clip_coef, params)
            finally:
                if recorder is not None:
                    recorder.close()
                trainer.close()
        return recorder.records, rows

    return record


def reference_side(cfg, world_size: int) -> Side:
    """The unsharded reference, recorded."""

    def record(steps, dtype, out):
        from lockstep.checks.reference import run_reference

        recorders = []

        def watch(model, optimizer):
            recorders.append(Recorder(model, optimizer))
            return recorders[-1]

        ctx = dv.default_dtype(dtype) if dtype is not None else contextlib.nullcontext()
        with ctx:
            ref = run_reference(cfg, world_size, steps, watch=watch)
        recorders[0].close()
        return recorders[0].records, ref.steps

    return record


@dataclass
class Findings:
    parting: dv.Parting | None
    verdict: dv.Verdict | None
    reproduced: bool
    lines: list[str]

    def to_dict(self) -> dict:
        return {
            "parting": self.parting.to_dict() if self.parting else None,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "reproduced": self.reproduced,
            "lines": self.lines,
        }


def rank0(obj):
    """Rank 0's `obj` on every rank, so that the ranks go on alike."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def investigate(
    sides: dict[str, Side],
    workdir: Path,
    div: Divergence | None,
    last_step: int,
    rtol: float,
    atol: float,
    first_step: int = 1,
    passes: tuple[str, ...] = PASSES,
    float64: bool = False,
    rows32: tuple[list[dict], list[dict]] | None = None,
) -> Findings:
    """Both sides replayed to the diverging step (or `last_step`): where they part; with
    `float64`, whether the difference is rounding noise."""
    (a, side_a), (b, side_b) = sides.items()
    step = div.step if div is not None and div.metric != "step" else last_step
    lines: list[str] = []
    rec_a, _ = side_a(step, None, workdir / "replay-a")
    rec_b, _ = side_b(step, None, workdir / "replay-b")
    parting = dv.first_difference(rec_a, rec_b, rtol, atol, range(first_step, step + 1), passes)
    reproduced = parting is not None
    if parting is not None:
        lines.append(f"first parting: {parting.describe(a, b)}")
    else:
        lines.append(
            f"the replay of steps {first_step}..{step} does not reproduce the difference "
            f"({'bitwise' if rtol == atol == 0 else f'rtol={rtol:g}'}): every module's output, "
            "gradient and update agree"
        )
    verdict = None
    if float64 and div is not None and div.metric in ("loss", "grad_norm"):
        try:
            r64a, rows64a = side_a(step, torch.float64, workdir / "replay64-a")
            r64b, rows64b = side_b(step, torch.float64, workdir / "replay64-b")
        except Exception as exc:  # an engine without float64 (DeepSpeed)
            verdict = dv.Verdict("unavailable", f"no float64 replay: {type(exc).__name__}")
        else:
            grads = None
            ga = [r.backward for r in r64a if r.step == step]
            gb = [r.backward for r in r64b if r.step == step]
            if ga and gb and ga[0] and gb[0]:
                grads = (ga[0], gb[0])
            at = {r["step"]: r for r in rows64a}, {r["step"]: r for r in rows64b}
            if rows32 is not None:
                was = ({r["step"]: r for r in rows32[0]}, {r["step"]: r for r in rows32[1]})
                was = (was[0].get(step, {}), was[1].get(step, {}))
            else:
                was = ({div.metric: div.expected}, {div.metric: div.actual})
            now = (at[0].get(step, {}), at[1].get(step, {}))
            verdict = dv.judge(div.metric, was, now, grads)
        lines.append(f"float64 replay of step {step}: {verdict.text}")
    return rank0(Findings(parting, verdict, reproduced, lines))


def investigated(result: CheckResult, sides: dict[str, Side], workdir: Path, last_step: int,
                 rtol: float, atol: float, **options) -> CheckResult:  # fmt: skip
    """A failed result with its replay's findings (`investigate`)."""
    found = investigate(sides, workdir, result.divergence, last_step, rtol, atol, **options)
    result.forensics = found.to_dict()
    result.notes.extend(found.lines)
    if found.verdict is not None and found.verdict.kind in ("factor", "dependence", "noise"):
        result.diagnosis = f"{found.verdict.text}; {result.diagnosis}"
    return result
