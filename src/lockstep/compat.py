"""torch's, DeepSpeed's and Python's private APIs that lockstep relies on, in one place: after a
torch (or DeepSpeed, or Python) upgrade, this is the file to read. Public torch and torchelastic
API (`elastic_launch`, `ChildFailedError`, `DefaultLogsSpecs` ...) is used where it is needed,
not here.

Nothing here imports torch when this module is imported.
"""

from __future__ import annotations

import sys

# A private module every forked rank has imported (`launch.forkserver.BASE_PRELOAD`): the first
# optimizer a process builds imports it, 2 s of CPU here, as much as torch itself.
TORCH_DYNAMO = "torch._dynamo"

# The signals torchelastic's PContext.start installs its handlers for, and which it sets
# (`launch.cleanup.launch_scope` puts both back as they were after a launch).
ELASTIC_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def all_gather_single(dist, output, tensor) -> None:
    """Every rank's `tensor` into one `output` tensor: `dist.all_gather_single` from torch
    2.13, which deprecates the same call's older name, `all_gather_into_tensor` (and warns on
    stderr at each use), used before it."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor)


def nccl_in_build(torch) -> bool:
    """Whether this torch was built with NCCL (`torch._C._nccl_version`); without it
    `torch.cuda.nccl.version()` fails."""
    return hasattr(torch._C, "_nccl_version")


def default_group():
    """The default process group (c10d's `_get_default_group`); raises when there is none."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def default_group_or_none():
    """The default process group, or None when there is none (c10d's `_world.default_pg`)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.default_pg


def process_groups() -> list:
    """Every process group c10d holds, the default one included (`_world.pg_map`)."""
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map)


# The flight recorder's buffer size (entries per process; 0 turns it off). torch 2.13 reads
# TORCH_FR_BUFFER_SIZE, then TORCH_NCCL_TRACE_BUFFER_SIZE, default 2000, for every backend
# (gloo included: FlightRecorder.hpp); older torch reads only the NCCL name.
FR_BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def dump_flight_recorder() -> bytes:
    """This process's flight recorder, pickled (`_dump_fr_trace`: a dict of builtins with a
    "version" field, "pg_config", "pg_status" and "entries", one per collective).

    Without the entries' C++/Python stack traces: symbolizing them imports `torch._inductor`
    (about 800 modules, 1.1-2 CPU-s a rank, every rank at its end), and lockstep's report takes
    each rank's Python stack from faulthandler instead.

    Under NCCL the entries are in NCCL's own recorder (`_dump_nccl_trace`): `_dump_fr_trace`
    returned an empty dump after four completed NCCL collectives on an H200 (torch 2.11)."""
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
    """A DeepSpeed engine's parsed config (`DeepSpeedEngine._config`): lockstep sets its
    `load_universal_checkpoint` flag before a load, the only time DeepSpeed reads it."""
    return engine._config


def quick_rendezvous_event_names() -> None:
    """Make torchelastic's dynamic rendezvous (c10d, torchrun's default) name its events without
    `inspect.stack()`; once per process, idempotent.

    `DynamicRendezvousHandler._record` names each event `get_method_name()`, which calls
    `inspect.stack()` twice: every frame's source lines read, and each frame's module looked
    up through all of `sys.modules`. It does so before `construct_and_record_rdzv_event` finds
    that no handler records the event (torch's default), for each of the events of a launch.
    With torch, DeepSpeed and transformers imported and a deep stack, that was most of the CPU
    of a launch (docs/benchmarks.md, "torchelastic's rendezvous events"). The replacement
    reads the one frame it names (`sys._getframe`): the same name, from the same frame."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = _calling_method_name


def _calling_method_name(depth: int = 2) -> str:
    """`dynamic_rendezvous.get_method_name`'s answer: the name of the function `depth` frames
    up from this one (`inspect.stack()[depth].function`), or its "no_method_name"."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def remove_temporary_folders() -> None:
    """Remove the folders of the `tempfile.TemporaryDirectory` objects this process holds, as
    Python's exit would (their `weakref.finalize` runs at exit), in a process about to end with
    `os._exit`, which leaves them behind: wandb makes two at import ("tmp...wandb-artifacts",
    "tmp...wandb-media"). Not those a forked rank inherited (`disown_temporary_folders`)."""
    for finalizer in _temporary_folder_finalizers():
        held = finalizer.peek()
        if held is not None and finalizer.atexit:
            held[0].cleanup()  # as the object's own cleanup, without the implicit-cleanup warning


def disown_temporary_folders() -> None:
    """In a process just forked: the `tempfile.TemporaryDirectory` folders it inherited are its
    parent's, removed by neither this process's exit nor `remove_temporary_folders`."""
    for finalizer in _temporary_folder_finalizers():
        finalizer.atexit = False


def _temporary_folder_finalizers() -> list:
    """The live finalizers of `tempfile.TemporaryDirectory` objects (`weakref.finalize`'s
    registry; each calls the class's `_cleanup`)."""
    import tempfile
    import weakref

    cleanup = tempfile.TemporaryDirectory._cleanup.__func__
    registry = list(weakref.finalize._registry.items())
    return [f for f, info in registry if getattr(info.func, "__func__", None) is cleanup]
