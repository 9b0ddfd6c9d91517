"""What each rank of `lockstep check NAME CONFIG` runs, and `run_ranks` to start the ranks:
one launch runs a check's trainings in turn, paying the process start once.
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
    """Rank 0's return value of `fn(*args)` on `nproc` local ranks of the run `cfg`, or a
    LockstepError."""
    from lockstep.train.trainer import rank_modules

    device = cfg.resolved_device()
    # NCCL's algorithm and cuBLAS's workspace otherwise change the reduction order between runs
    if device != "cpu" and cfg.deterministic:
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    preload = [fn.__module__, "lockstep.checks.harness", *preload, *rank_modules(cfg)]
    return run_local(fn, args, nproc, "check", device, preload, timeout=timeout,
                     forensics=forensics, max_restarts=max_restarts)  # fmt: skip


def in_group(device: str, body, attempt: int | None = None):
    """`body()` inside one process group for the whole launch (DeepSpeed keeps the first)."""
    import torch.distributed as dist

    from lockstep.train.trainer import join_process_group

    del attempt  # the store's prefix is an epoch the ranks agree on (train.group)
    owned = join_process_group(device)
    try:
        return body()
    except LockstepError as err:
        return LockstepError(str(err), err.exit_code)
    finally:
        if owned:
            dist.destroy_process_group()


def rank_calls(calls: list, config: dict, workdir: str, options: dict) -> list:
    """One rank of `lockstep check NAME CONFIG`: each of `calls` in order; their non-None
    results."""
    from lockstep.checks.harness import shared_runs
    from lockstep.train.config import from_dict

    cfg = from_dict(config)
    out = Path(workdir)

    def body():
        with shared_runs():
            found = [fn(cfg, out, **options) for fn in calls]
        return [result for result in found if result is not None]

    return in_group(cfg.resolved_device(), body)
