"""What each rank of a harness check (`lockstep check NAME CONFIG`) runs, and `run_ranks` to
start them on this machine (`lockstep.local_ranks.run_local`) and collect rank 0's result.

One launch runs the several trainings of a check one after another in the same processes,
so a check pays the process start (several seconds with DeepSpeed) once, not per training.
The elastic check's ranks kill one of themselves and resume after a restart.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from lockstep.errors import LockstepError
from lockstep.local_ranks import run_local

ELASTIC_STATE = "elastic-reference.pt"


def run_ranks(
    fn, args: tuple, nproc: int, device: str, max_restarts: int = 0, deterministic: bool = True
) -> Any:
    """Run `fn(*args)` on `nproc` local ranks; rank 0's return value, or a LockstepError."""
    # Pinned before NCCL and cuBLAS start: NCCL's algorithm choice and cuBLAS's workspace
    # are otherwise free to change the reduction order between runs (torchtitan pins both).
    if device != "cpu" and deterministic:
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return run_local(fn, args, nproc, "check", device, max_restarts=max_restarts)


def _in_group(device: str, body, attempt: int | None = None):
    """Run `body()` inside a process group this rank creates and destroys (DeepSpeed keeps
    the group it first saw, so all trainings of a launch must share one).

    After an elastic restart the agent's store still holds the first attempt's gloo/nccl
    addresses under the default group's keys, so each attempt gets its own key prefix.
    """
    import torch.distributed as dist

    from lockstep.train.trainer import PG_TIMEOUT, join_process_group

    if attempt is None:
        owned = join_process_group(device)
    else:
        store, rank, world = next(dist.rendezvous("env://", timeout=PG_TIMEOUT))
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo",
            store=dist.PrefixStore(f"lockstep/attempt{attempt}", store),
            rank=rank,
            world_size=world,
            timeout=PG_TIMEOUT,
        )
        owned = True
    try:
        return body()
    except LockstepError as err:
        return LockstepError(str(err), err.exit_code)
    finally:
        if owned:
            dist.destroy_process_group()


def rank_checks(names: list[str], config: dict, workdir: str, options: dict) -> list:
    """One rank of `lockstep check NAME CONFIG`: run the named harness checks in order."""
    from lockstep.checks import harness
    from lockstep.train.config import from_dict

    cfg = from_dict(config)
    out = Path(workdir)

    def body():
        results = []
        for name in names:
            if name == "resume-reference":
                harness.resume_reference(cfg, out, options["half"])
                continue
            if name == "resume-compare":
                results.append(harness.resume_compare(cfg, out, options["half"]))
            else:
                results.append(harness.RANK_CHECKS[name](cfg, out))
        return results

    return _in_group(cfg.resolved_device(), body)


def rank_elastic(config: dict, workdir: str, kill_at: int) -> dict | LockstepError:
    """One rank of the elastic check, under a launch with one restart allowed.

    First attempt: an uninterrupted reference run, then the checkpointed run, during which
    rank 1 kills itself with SIGKILL after step `kill_at`. The agent restarts every rank;
    the second attempt resumes from the latest checkpoint and trains to the end.
    """
    import torch

    from lockstep.checks import harness
    from lockstep.checks.state import rows
    from lockstep.train.config import from_dict
    from lockstep.train.trainer import Trainer, run_training

    cfg = from_dict(config)
    out = Path(workdir)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def body():
        if attempt == 0:
            plain = harness.derive(cfg, checkpoint__at_end=False, checkpoint__every=0,
                                   checkpoint__resume="never")  # fmt: skip
            reference = run_training(plain, out / "uninterrupted")
            if int(os.environ["RANK"]) == 0:
                torch.save(
                    {"steps": rows(reference.steps), "digest": reference.param_digest},
                    out / ELASTIC_STATE,
                )
        job = harness.derive(
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
            "reference": torch.load(out / ELASTIC_STATE, weights_only=False),
        }

    return _in_group(cfg.resolved_device(), body, attempt)
