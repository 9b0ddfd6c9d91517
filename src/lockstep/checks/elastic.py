"""The elastic check: rank 1 is SIGKILLed mid-run under a launch with one restart allowed; the
resumed job must equal an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from lockstep.checks.harness_ranks import in_group, run_ranks
from lockstep.checks.result import CheckResult
from lockstep.checks.trajectory import first_divergence
from lockstep.errors import LockstepError

ELASTIC_STATE = "elastic-reference.pt"


def run(cfg, workdir: Path, nproc: int):
    """The check of run `cfg` on `nproc` local ranks, rank 1 killed after half the steps."""
    kill_at = max(1, cfg.steps // 2)
    config = cfg.model_dump(mode="json")
    outcome = run_ranks(rank_elastic, (config, str(workdir), kill_at), nproc, cfg, max_restarts=1)
    return judge_elastic(outcome, kill_at)


def plan(launches, check) -> list[CheckResult]:
    """`lockstep check elastic`: the check's own launch, shown."""
    result = run(launches.cfg, launches.workdir / "elastic", launches.nproc)
    launches.show(result)
    return [result]


def rank_elastic(config: dict, workdir: str, kill_at: int) -> dict | LockstepError:
    """One rank: an uninterrupted run, then a checkpointed one that rank 1 kills at `kill_at`."""
    import torch

    from lockstep.checks.harness import check_config, without_checkpoints
    from lockstep.checks.state import rows
    from lockstep.train import checkpoint
    from lockstep.train.config import from_dict
    from lockstep.train.trainer import Trainer, run_training

    cfg = from_dict(config)
    out = Path(workdir)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def body():
        if attempt == 0:
            reference = run_training(without_checkpoints(cfg), out / "uninterrupted")
            if int(os.environ["RANK"]) == 0:
                torch.save(
                    {"steps": rows(reference.steps), "digest": reference.param_digest},
                    out / ELASTIC_STATE,
                )
        job = check_config(
            cfg,
            checkpoint__every=1,
            checkpoint__resume="auto",
            checkpoint__dir=str(out / "elastic" / "checkpoints"),
        )
        trainer = Trainer(job, out / "elastic")
        try:
            start = trainer.step
            if attempt == 0:
                trainer.train(stop_at=kill_at)
                if int(os.environ["RANK"]) == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
            result = trainer.train()
        finally:
            trainer.close()
        return {
            "attempt": attempt,
            "start_step": start,
            "steps": rows(result.steps),
            "digest": result.param_digest,
            "reference": checkpoint.load_file(out / ELASTIC_STATE),
        }

    return in_group(cfg.resolved_device(), body, attempt)


def judge_elastic(outcome: dict, kill_at: int) -> CheckResult:
    """The restarted job against the uninterrupted run: steps after the resume, final
    parameters."""
    ref = outcome["reference"]
    if outcome["attempt"] != 1 or outcome["start_step"] != kill_at:
        return CheckResult(
            "elastic",
            False,
            f"after the kill the job ran attempt {outcome['attempt']} from step "
            f"{outcome['start_step']}, expected attempt 1 resuming at step {kill_at}",
            diagnosis="the restart did not resume from the latest checkpoint",
        )
    last = ref["steps"][-1]["step"]
    div = first_divergence(ref["steps"], outcome["steps"], steps=range(kill_at + 1, last + 1))
    if div is not None:
        return CheckResult(
            "elastic",
            False,
            f"the restarted job diverges at {div.describe('uninterrupted', 'restarted')}",
            divergence=div,
            diagnosis="state lost across the restart: parameters, optimizer, LR schedule, RNG "
            "or data position (run `lockstep check resume` to see which)",
        )
    if outcome["digest"] != ref["digest"]:
        return CheckResult("elastic", False, "metrics match but the final parameter digests differ")
    return CheckResult(
        "elastic",
        True,
        f"rank 1 SIGKILLed after step {kill_at}; the restarted job resumed at step {kill_at} and "
        f"steps {kill_at + 1}..{last} and the final parameters equal an uninterrupted run",
    )
