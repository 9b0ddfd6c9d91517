"""Ranks forked from the forkserver (`lockstep.launch`): the server's heap is frozen for
them, the launching process's is not."""

import gc
import signal
import tempfile
from pathlib import Path

import pytest

from lockstep.errors import LockstepError
from lockstep.launch import run_local
from lockstep.launch.forkserver import vector_width as applied_width


def collector_state() -> tuple[int, bool, int]:
    """On a rank: how many objects are frozen, whether gc runs, and what a collection frees."""
    cycle: list = []
    cycle.append(cycle)
    del cycle
    return gc.get_freeze_count(), gc.isenabled(), gc.collect()


def test_forked_ranks_never_walk_the_servers_heap():
    frozen, enabled, freed = run_local(collector_state, (), nproc=1, name="gc", device="cpu")
    assert frozen > 100_000  # torch and the rest of the preload: out of the collector's reach
    assert enabled and freed >= 1  # the rank's own garbage is still collected
    assert gc.get_freeze_count() == 0  # the launching process is left as it was


def death_signal() -> int:
    """On a rank: the signal it gets when its parent ends (PR_GET_PDEATHSIG)."""
    import ctypes

    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)
    return sig.value


def test_spawned_ranks_die_with_the_launching_process():
    # device "cuda" picks the spawn start method (GPU ranks); the function touches no GPU
    assert run_local(death_signal, (), nproc=1, name="spawn", device="cuda") == signal.SIGKILL


def vector_width() -> str:
    """On a rank: the width of ATen's vector kernels (fixed at its first kernel)."""
    import torch

    torch.ones(8).sum()
    return torch.backends.cpu.get_cpu_capability()


def test_a_forked_rank_follows_the_vector_width_its_environment_asks(monkeypatch):
    # the noise floor's perturbed runs of a --run-path script: no new interpreter needed
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert run_local(vector_width, (), nproc=1, name="width", device="cpu") == "DEFAULT"


def test_a_width_asked_too_late_fails_instead_of_measuring_nothing(monkeypatch):
    import torch

    torch.ones(8).sum()  # this process ran a kernel: its width is fixed
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector kernels wider than the default")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    with pytest.raises(RuntimeError, match="came too late"):
        applied_width()


HELD: list = []  # a library's folder for the life of the process, as wandb makes at import


def holds_a_temporary_folder() -> str:
    """On a rank: a temporary folder held until the process ends; its path."""
    HELD.append(tempfile.TemporaryDirectory(prefix="lockstep-test-held-"))
    return HELD[-1].name


def test_a_forked_rank_leaves_no_temporary_folder_it_held():
    # the rank ends with os._exit (multiprocessing's), which Python's exit cleanup never sees
    folder = run_local(holds_a_temporary_folder, (), nproc=1, name="held", device="cpu")
    assert folder.startswith(tempfile.gettempdir()) and not Path(folder).exists()


def fails() -> None:
    raise RuntimeError("planted")


def test_a_failed_forked_rank_leaves_no_error_file(tmp_path, monkeypatch):
    # torch.multiprocessing's start_processes makes each rank's error file (delete=False) in the
    # launching process's temporary folder; a failed rank's traceback stays in it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(LockstepError, match="rank 0 failed"):
        run_local(fails, (), nproc=1, name="fails", device="cpu")
    assert list(tmp_path.iterdir()) == []
