"""What each rank of a harness check (`lockstep check NAME CONFIG`) runs, and `run_ranks` to
start them on this machine (`lockstep.local_ranks.run_local`) and collect rank 0's result.

One launch runs the several trainings of a check one after another in the same processes,
so a check pays the process start (several seconds with DeepSpeed) once, not per training.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lockstep.errors import LockstepError
from lockstep.launch import run_local


def run_ranks(fn, args: tuple, nproc: int, cfg, max_restarts: int = 0) -> Any:
    """Run `fn(*args)` on `nproc` local ranks of the run `cfg`; rank 0's return value, or a
    LockstepError."""
    from lockstep.train.trainer import rank_modules

    device = cfg.resolved_device()
    # Pinned before NCCL and cuBLAS start: NCCL's algorithm choice and cuBLAS's workspace
    # are otherwise free to change the reduction order between runs (torchtitan pins both).
    if device != "cpu" and cfg.deterministic:
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    preload = [fn.__module__, "lockstep.checks.harness", *rank_modules(cfg)]
    return run_local(fn, args, nproc, "check", device, preload, max_restarts=max_restarts)


def in_group(device: str, body, attempt: int | None = None):
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

    return in_group(cfg.resolved_device(), body)
