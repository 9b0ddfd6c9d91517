"""What each rank of a harness check (`lockstep check NAME CONFIG`) runs, and `run_ranks` to
start them on this machine (`lockstep.launch.run_local`) and collect rank 0's result.

One launch runs the several trainings of a check one after another in the same processes,
so a check pays the process start (several seconds with DeepSpeed) once, not per training.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lockstep.errors import LockstepError
from lockstep.launch import run_local


def run_ranks(fn, args: tuple, nproc: int, cfg, max_restarts: int = 0,
              timeout: float | None = None, forensics: Path | None = None,
              preload: list[str] = ()) -> Any:  # fmt: skip
    """Run `fn(*args)` on `nproc` local ranks of the run `cfg`; rank 0's return value, or a
    LockstepError. `timeout` (seconds) and `forensics` (the ranks' flight-recorder dumps'
    folder): `lockstep.launch.run_local`'s; `preload`: more modules the ranks import first
    (the checks they run)."""
    from lockstep.train.trainer import rank_modules

    device = cfg.resolved_device()
    # Pinned before NCCL and cuBLAS start: NCCL's algorithm choice and cuBLAS's workspace
    # are otherwise free to change the reduction order between runs (torchtitan pins both).
    if device != "cpu" and cfg.deterministic:
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    preload = [fn.__module__, "lockstep.checks.harness", *preload, *rank_modules(cfg)]
    return run_local(fn, args, nproc, "check", device, preload, timeout=timeout,
                     forensics=forensics, max_restarts=max_restarts)  # fmt: skip


def in_group(device: str, body, attempt: int | None = None):
    """Run `body()` inside a process group this rank creates and destroys (DeepSpeed keeps
    the group it first saw, so all trainings of a launch must share one).

    Under torchrun the group's keys go under this attempt's own prefix in the agent's shared
    store (`lockstep.train.group`), as `lockstep train` does; `attempt` is the caller's count
    of restarts, kept for its own use.
    """
    import torch.distributed as dist

    from lockstep.train.trainer import join_process_group

    del attempt  # the namespace is an epoch all ranks agree on in the store (train.group)
    owned = join_process_group(device)
    try:
        return body()
    except LockstepError as err:
        return LockstepError(str(err), err.exit_code)
    finally:
        if owned:
            dist.destroy_process_group()


def rank_calls(calls: list, config: dict, workdir: str, options: dict) -> list:
    """One rank of `lockstep check NAME CONFIG`: `fn(cfg, workdir, **options)` for each of
    `calls` (rank-side functions, `registry.Function`) in order, in one process group; the
    results they return (a function that only prepares, returning None, adds none)."""
    from lockstep.checks.harness import shared_runs
    from lockstep.train.config import from_dict

    cfg = from_dict(config)
    out = Path(workdir)

    def body():
        with shared_runs():  # the checks of this launch train a config once
            found = [fn(cfg, out, **options) for fn in calls]
        return [result for result in found if result is not None]

    return in_group(cfg.resolved_device(), body)
