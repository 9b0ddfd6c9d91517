"""CPU ranks forked from a forkserver that imported torch, transformers and DeepSpeed once (its
preload), instead of each spawned rank importing them again (2-6 s of CPU each): the
forkserver is a single-threaded process that ran no torch op, so its children start clean (a
fork of a process whose OpenMP pool ran hangs in the child). On GPUs ranks are spawned
(`ranks.run_local`), so no parent ever touches CUDA before a rank.

The server's heap is frozen before any rank forks (`gc_freeze`, last in its preload). A forked
rank takes on the launching process's environment and stdout/stderr (`Launcher.adopt`); a
script run in one (`run_script`) runs as `python -u script` would.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from lockstep.compat import TORCH_DYNAMO, disown_temporary_folders, remove_temporary_folders
from lockstep.launch.cleanup import die_with

# What every forked rank has imported: torch._dynamo too, which the first optimizer a process
# builds imports (2 s of CPU here, as much as torch itself). This module: the ranks' entry
# points (`in_environ`, `run_script`).
BASE_PRELOAD = ["torch", TORCH_DYNAMO, "torch.distributed", "lockstep.track", __name__]
# Imported last into the server: its heap collected once and frozen.
FREEZE = "lockstep.launch.gc_freeze"
# The environment the forkserver of this process started with (None: not started by us).
_forkserver_environ: dict[str, str] | None = None


def start_forkserver(preload: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Start this process's forkserver with `BASE_PRELOAD` and `preload` imported, then frozen
    out of the garbage collector's reach (`FREEZE`); once: later calls reuse it, whatever they
    preload. Returns the environment it started with."""
    global _forkserver_environ
    if _forkserver_environ is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*BASE_PRELOAD, *preload, FREEZE])
        _forkserver_environ = dict(os.environ)
        forkserver.ensure_running()
    return _forkserver_environ


def forkserver_context(preload: list[str] | tuple[str, ...] = ()):
    """The "forkserver" multiprocessing context, its server started (`BASE_PRELOAD` and
    `preload` imported; or already running): for CPU ranks that must not pay torch's import
    each. The server never ran a torch op, so a rank may still use CUDA; nothing it imports
    may initialize CUDA (no GPU probe), or forked ranks could not use it."""
    start_forkserver(preload)
    return multiprocessing.get_context("forkserver")


class Launcher:
    """The launching process as a forked rank needs it: its pid, its environment and its
    stdout/stderr now (the forkserver has those of when it started). Pickled for the rank,
    the two file descriptors travel as multiprocessing passes a Connection's (`DupFd`).
    `streams`: the launcher's descriptors that become the rank's stdout and stderr (its own by
    default; pipes of its own for a caller that reads the rank's output apart)."""

    def __init__(self, server: dict[str, str], environ: dict[str, str], pid=None, fds=None,
                 streams: tuple[int, int] = (1, 2)):  # fmt: skip
        self.server, self.environ, self.pid, self.fds = server, environ, pid or os.getpid(), fds
        self.streams = streams

    def __reduce__(self):
        from multiprocessing import reduction

        fds = tuple(reduction.DupFd(fd) for fd in self.streams)
        return Launcher, (self.server, self.environ, self.pid, fds)

    def adopt(self) -> None:
        """On the rank: the launcher's stdout/stderr and environment of now, keeping what
        torchelastic set for this rank; the rank ends when the launcher does. The temporary
        folders the server made are the server's (`compat.disown_temporary_folders`)."""
        die_with(self.pid)
        disown_temporary_folders()
        if self.fds is not None:
            sys.stdout.flush(), sys.stderr.flush()
            for target, dup in zip((1, 2), self.fds, strict=True):
                fd = dup.detach()
                os.dup2(fd, target)
                os.close(fd)
        ours = {k for k, v in os.environ.items() if self.server.get(k) != v}  # torchelastic's
        for key in set(os.environ) - set(self.environ) - ours:
            del os.environ[key]
        os.environ.update({k: v for k, v in self.environ.items() if k not in ours})
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # OpenMP read it at import, in the server
            import torch

            torch.set_num_threads(int(threads))
        vector_width()
        blas_library()


# ATen's x86 vector widths, narrowest first (`torch.backends.cpu.get_cpu_capability()`)
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")


def vector_width() -> None:
    """ATEN_CPU_CAPABILITY as this rank's environment asks (a noise-floor run reorders its
    sums with it): ATen reads it at its first kernel dispatch, which the server never made, so a
    forked rank still chooses. A rank that finds a wider width than it asked for (a server that
    ran a kernel) fails instead of measuring nothing; one narrower is all the CPU has."""
    wanted = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    if wanted not in CAPABILITIES:
        return
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    if got in CAPABILITIES and CAPABILITIES.index(got) > CAPABILITIES.index(wanted):
        raise RuntimeError(
            f"ATEN_CPU_CAPABILITY={wanted.lower()} came too late for this forked rank (ATen "
            f"already runs {got}): run it without --run-path"
        )


def blas_library() -> None:
    """TORCH_BLAS_PREFER_CUBLASLT as this rank's environment asks (a noise-floor run on a GPU
    swaps cuBLAS for cuBLASLt): ATen read it when the server imported torch, so a forked rank
    sets it as a new interpreter would have. Without CUDA there is no BLAS library to choose."""
    wanted = os.environ.get("TORCH_BLAS_PREFER_CUBLASLT", "").strip().lower()
    library = {"1": "cublaslt", "true": "cublaslt", "0": "cublas", "false": "cublas"}
    if wanted not in library:
        return
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library(library[wanted])


def in_environ(launcher: Launcher, fn, *args):
    """A forked rank's entry point: `launcher.adopt()`, then `fn(*args)`; the temporary
    folders the rank made (wandb's, at import) are removed after, since the rank ends with
    `os._exit` (multiprocessing's), not through Python's exit."""
    launcher.adopt()
    from lockstep.forensics import recorder

    try:  # the dumps, when the launch asked for them (`lockstep.forensics`)
        return recorder.run(fn, *args)
    finally:
        remove_temporary_folders()


class _OsExit(SystemExit):
    """A script's `os._exit` in a forked rank (`_exit_through_return`)."""


def _exit_through_return(code: int = 0):
    """`os._exit` for a script in a forked rank: torchelastic's function mode needs the rank's
    function to return (an exit without its return value looks like a rank still running), and
    the rank process itself then ends with `os._exit`, without Python's finalization."""
    sys.stdout.flush(), sys.stderr.flush()
    raise _OsExit(code)


def run_script(log: str, cwd: str, script: str, *args: str) -> None:
    """On a forked rank: run `script` as `__main__` with `args`, as `python -u script args`
    would in `cwd` (its folder first on sys.path; `-m module args`: the module, `cwd` first),
    its output appended to `log`. The rank then ends with the real `os._exit` (the forkserver's
    child calls it) after the atexit handlers (after a script's `os._exit`: only its flight
    record's), not through Python's finalization, which tore down the whole heap forked from
    the server (about 0.25 CPU-s a rank here)."""
    import atexit
    import faulthandler
    import runpy

    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1), os.dup2(fd, 2), os.close(fd)
    sys.stdout.reconfigure(write_through=True), sys.stderr.reconfigure(write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    os.chdir(cwd)
    os._exit, real_exit = _exit_through_return, os._exit
    if script == "-m":
        sys.argv = list(args)  # runpy puts the module's file first, as python -m does
        if args[0] != "lockstep":  # lockstep's own runs as `python -P` would (OWN_MODULE)
            sys.path.insert(0, cwd)
        run = lambda: runpy.run_module(args[0], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    ended_by_os_exit = False
    try:
        run()
    except _OsExit:
        ended_by_os_exit = True
        raise
    except SystemExit:
        raise
    except BaseException:
        import traceback

        from lockstep.forensics import recorder

        recorder.dump_on_error(sys.exc_info())  # torchelastic's handler, not the excepthook
        traceback.print_exc()  # as the interpreter prints it, before torchelastic's summary
        raise
    finally:
        os._exit = real_exit
        if not ended_by_os_exit:
            atexit._run_exitfuncs()  # as the interpreter's exit runs them
        else:  # the rank's flight record, which its atexit handler wrote here before
            from lockstep.forensics import recorder

            recorder.finished()
