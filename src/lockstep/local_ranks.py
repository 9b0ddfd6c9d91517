"""Start N ranks on this machine through torchrun's own launcher API, as `--standalone` does.

Shared by `lockstep preflight --nproc N` and `lockstep train --nproc N`: a c10d rendezvous on
the loopback with a port the OS picks (never a fixed port), no restarts.
"""

from __future__ import annotations

import uuid


def standalone_config(nproc: int, name: str, **overrides):
    """A LaunchConfig for `nproc` local ranks; `overrides` set any other LaunchConfig field."""
    from torch.distributed.launcher.api import LaunchConfig

    fields = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": nproc,
        "run_id": f"lockstep-{name}-{uuid.uuid4().hex[:8]}",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
        "monitor_interval": 0.1,
    }
    fields.update(overrides)
    return LaunchConfig(**fields)


def run_local(fn, args: tuple, nproc: int, name: str, **overrides) -> dict:
    """Run `fn(*args)` on `nproc` spawned local ranks; {rank: return value}.

    A rank that fails (an exception, a signal) ends in one LockstepError naming it; its
    traceback was already printed by torchelastic's error handler.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, LockstepError

    config = standalone_config(nproc, name, start_method="spawn", **overrides)
    try:
        return elastic_launch(config, fn)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise LockstepError(
            f"rank {rank} failed with exit code {failure.exitcode}; its traceback is above",
            EXIT_FAIL,
        ) from None
