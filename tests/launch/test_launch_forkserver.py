"""Ranks forked from the forkserver (`lockstep.launch`): the server's heap is frozen for
them, the launching process's is not."""

import gc
import signal

from lockstep.launch import run_local


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
