"""The determinism check: the same run twice gives identical metrics and final state; a
failure is replayed to name the module where the runs part.
"""

from __future__ import annotations

import json
from pathlib import Path

from lockstep.checks import divergence as dv
from lockstep.checks.divergence_replay import investigated, trainer_side
from lockstep.checks.harness import (
    exact_tolerance,
    first_param_difference,
    trained,
    without_checkpoints,
    world_size,
)
from lockstep.checks.result import CheckResult, skipped_notes, tolerance, unsound
from lockstep.checks.script_runs import Runs, ScriptRunner, require_steps
from lockstep.checks.state import rows
from lockstep.checks.trajectory import first_divergence
from lockstep.module_digest import StepRecord
from lockstep.train.config import RunConfig
from lockstep.train.trainer import run_training

UNSEEDED = (
    "something is unseeded or nondeterministic: data order, init, dropout, or a "
    "nondeterministic kernel (set deterministic = true)"
)


def check_determinism(cfg: RunConfig, workdir: Path) -> CheckResult:
    """The same config twice: identical per-step metrics and final parameters."""
    rtol, atol = exact_tolerance(cfg)
    cfg = without_checkpoints(cfg)
    # the first may be shared with another check (`harness.shared_runs`), never the second
    runs = [
        trained(cfg, workdir / "determinism-1"),
        run_training(cfg, workdir / "determinism-2", capture_state=True),
    ]
    logged = {"run1": rows(runs[0].steps), "run2": rows(runs[1].steps)}
    bad = unsound("determinism", logged)
    if bad is not None:
        bad.summary = f"{cfg.engine.name}: {bad.summary}"
        return bad
    div = first_divergence(logged["run1"], logged["run2"], rtol=rtol, atol=atol)
    if div is None:
        diff = first_param_difference(runs[0].params, runs[1].params, rtol, atol)
        if diff is None:
            return CheckResult(
                "determinism",
                True,
                f"{cfg.engine.name}: two runs of {cfg.steps} steps on {world_size()} ranks agree "
                f"{tolerance(rtol, atol)}, final parameter digest {runs[0].param_digest[:16]}",
                notes=skipped_notes(logged),
            )
        failed = CheckResult(
            "determinism",
            False,
            f"{cfg.engine.name}: metrics agree but the final parameters differ ({diff})",
            diagnosis="a nondeterministic update: a kernel or reduction order that varies",
        )
    else:
        failed = CheckResult(
            "determinism",
            False,
            f"{cfg.engine.name}: two identical runs diverge at {div.describe('run1', 'run2')}",
            divergence=div,
            diagnosis=UNSEEDED,
        )
    sides = {"run1": trainer_side(without_checkpoints(cfg)),
             "run2": trainer_side(without_checkpoints(cfg))}  # fmt: skip
    return investigated(failed, sides, workdir / "determinism-replay", cfg.steps, rtol, atol)


# ------------------------------------------------------------------------------ a script


def check_script(runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float) -> CheckResult:
    """Two launches of the script with the same settings: identical metrics."""
    nproc, steps = asked.nproc, asked.steps
    first = runner.run("determinism-1", nproc=nproc, max_steps=steps)
    second = runner.run("determinism-2", nproc=nproc, max_steps=steps, reuse=False)
    require_steps(first, steps, "determinism-1")
    logged = {"run1": first, "run2": second}
    bad = runner.unsound("determinism", logged)
    if bad is not None:
        return bad
    div = first_divergence(first, second, rtol=rtol, atol=atol)
    if div is None:
        return CheckResult(
            "determinism",
            True,
            f"two runs of {steps} steps on {nproc} ranks agree {tolerance(rtol, atol)}",
            logs=runner.logs,
            notes=runner.take_notes() + skipped_notes(logged),
        )
    forensics = module_replay(runner, div.step, nproc, rtol, atol)
    return CheckResult(
        "determinism",
        False,
        f"two identical runs diverge at {div.describe('run1', 'run2')}",
        divergence=div,
        diagnosis="something is unseeded or nondeterministic: data order, sampling, init, "
        "or a nondeterministic kernel",
        logs=runner.logs,
        notes=runner.take_notes() + forensics["lines"],
        forensics=forensics,
    )


def read_watched(path: Path) -> list[StepRecord]:
    """The per-module digests a script wrote under `lockstep.track.watch`."""
    if not path.is_file():
        return []
    return [StepRecord.from_json(json.loads(line)) for line in path.read_text().splitlines()]


def module_replay(runner: ScriptRunner, step: int, nproc: int, rtol: float, atol: float):
    """Two more runs to `step` with LOCKSTEP_WATCH set, their per-module digests compared."""
    found = []
    for i in (1, 2):
        path = runner.workdir / f"determinism-watch-{i}" / "modules-{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("modules-*.jsonl"):
            old.unlink()
        runner.run(f"determinism-watch-{i}", nproc=nproc, max_steps=step, watch=path)
        found.append(read_watched(Path(str(path).replace("{rank}", "0"))))
    if not found[0] or not found[1]:
        line = "no module named: the script does not call lockstep.track.watch(model)"
        return {"parting": None, "verdict": None, "reproduced": None, "lines": [line]}
    parting = dv.first_difference(found[0], found[1], rtol, atol, range(1, step + 1))
    if parting is None:
        line = f"the replay of steps 1..{step} does not reproduce the difference"
    else:
        line = f"first parting: {parting.describe('run1', 'run2')}"
    return {
        "parting": parting.to_dict() if parting else None,
        "verdict": None,
        "reproduced": parting is not None,
        "lines": [line],
    }
