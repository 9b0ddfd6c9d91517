"""The private APIs of torch, DeepSpeed and Python that lockstep uses: read after an upgrade.
Imports no torch. Why each: docs/design/base.md.
"""

from __future__ import annotations

import sys

# the forkserver preloads it: a process's first optimizer imports it
TORCH_DYNAMO = "torch._dynamo"

# the signals torchelastic's PContext.start takes over
ELASTIC_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def all_gather_single(dist, output, tensor) -> None:
    """`all_gather_single`, or its older name before torch 2.13."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor)


def nccl_in_build(torch) -> bool:
    """Whether this torch was built with NCCL."""
    return hasattr(torch._C, "_nccl_version")


def default_group():
    """The default process group; raises without one."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def default_group_or_none():
    """The default process group, or None."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.default_pg


def process_groups() -> list:
    """Every process group, the default one included."""
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map)


# the flight recorder's size: new name, then old
FR_BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def dump_flight_recorder() -> bytes:
    """This process's flight recorder, pickled (NCCL's own under NCCL)."""
    import torch
    import torch.distributed as dist

    c10d = torch._C._distributed_c10d
    nccl = getattr(c10d, "_dump_nccl_trace", None)  # absent from CPU builds
    on_nccl = dist.is_initialized() and "nccl" in str(dist.get_backend())
    dump = nccl if nccl is not None and on_nccl else c10d._dump_fr_trace
    try:
        return dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except TypeError:  # a torch whose binding takes no options
        return dump()


def deepspeed_engine_config(engine):
    """A DeepSpeed engine's parsed config."""
    return engine._config


def quick_rendezvous_event_names() -> None:
    """Name torchelastic's rendezvous events from one frame, not `inspect.stack()`."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = _calling_method_name


def _calling_method_name(depth: int = 2) -> str:
    """The name of the function `depth` frames up."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def remove_temporary_folders() -> None:
    """Before `os._exit`: remove this process's `TemporaryDirectory` folders."""
    for finalizer in _temporary_folder_finalizers():
        held = finalizer.peek()
        if held is not None and finalizer.atexit:
            held[0].cleanup()  # no implicit-cleanup warning


def disown_temporary_folders() -> None:
    """In a forked process: keep the inherited `TemporaryDirectory` folders."""
    for finalizer in _temporary_folder_finalizers():
        finalizer.atexit = False


def _temporary_folder_finalizers() -> list:
    """The live `weakref.finalize` entries of `TemporaryDirectory` objects."""
    import tempfile
    import weakref

    cleanup = tempfile.TemporaryDirectory._cleanup.__func__
    registry = list(weakref.finalize._registry.items())
    return [f for f, info in registry if getattr(info.func, "__func__", None) is cleanup]
