"""CPU ranks forked from a forkserver that imported torch once, and how a forked rank takes on
the launching process's environment. Design: docs/design/launch.md
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from lockstep.compat import TORCH_DYNAMO, disown_temporary_folders, remove_temporary_folders
from lockstep.launch.cleanup import die_with

# torch._dynamo: the first optimizer a process builds imports it
BASE_PRELOAD = ["torch", TORCH_DYNAMO, "torch.distributed", "lockstep.track", __name__]
FREEZE = "lockstep.launch.gc_freeze"
_forkserver_environ: dict[str, str] | None = None


def start_forkserver(preload: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Start this process's forkserver once; the environment it started with."""
    global _forkserver_environ
    if _forkserver_environ is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*BASE_PRELOAD, *preload, FREEZE])
        _forkserver_environ = dict(os.environ)
        forkserver.ensure_running()
    return _forkserver_environ


def forkserver_context(preload: list[str] | tuple[str, ...] = ()):
    """The "forkserver" context, its server started; `preload` must not initialize CUDA."""
    start_forkserver(preload)
    return multiprocessing.get_context("forkserver")


class Launcher:
    """The launching process as a forked rank needs it now; `streams` become its stdout and
    stderr."""

    def __init__(self, server: dict[str, str], environ: dict[str, str], pid=None, fds=None,
                 streams: tuple[int, int] = (1, 2)):  # fmt: skip
        self.server, self.environ, self.pid, self.fds = server, environ, pid or os.getpid(), fds
        self.streams = streams

    def __reduce__(self):
        from multiprocessing import reduction

        fds = tuple(reduction.DupFd(fd) for fd in self.streams)
        return Launcher, (self.server, self.environ, self.pid, fds)

    def adopt(self) -> None:
        """On the rank: the launcher's streams and environment; it ends with the launcher."""
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


# ATen's x86 vector widths, narrowest first
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")


def vector_width() -> None:
    """Fail when ATEN_CPU_CAPABILITY came too late: the server ran a kernel."""
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
    """Apply TORCH_BLAS_PREFER_CUBLASLT, which ATen read when the server imported torch."""
    wanted = os.environ.get("TORCH_BLAS_PREFER_CUBLASLT", "").strip().lower()
    library = {"1": "cublaslt", "true": "cublaslt", "0": "cublas", "false": "cublas"}
    if wanted not in library:
        return
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library(library[wanted])


def in_environ(launcher: Launcher, fn, *args):
    """A forked rank's entry point; it ends with `os._exit`, so its temporary folders go here."""
    launcher.adopt()
    from lockstep.forensics import recorder

    try:
        return recorder.run(fn, *args)
    finally:
        remove_temporary_folders()


class _OsExit(SystemExit):
    """A script's `os._exit` in a forked rank."""


def _exit_through_return(code: int = 0):
    """`os._exit` for a script: torchelastic's function mode needs the rank's function to
    return."""
    sys.stdout.flush(), sys.stderr.flush()
    raise _OsExit(code)


def run_script(log: str, cwd: str, script: str, *args: str) -> None:
    """On a forked rank: `python -u script args` in `cwd` into `log`, without finalization."""
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
        if args[0] != "lockstep":  # lockstep's own as `python -P` would
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
        traceback.print_exc()
        raise
    finally:
        os._exit = real_exit
        if not ended_by_os_exit:
            atexit._run_exitfuncs()
        else:  # the flight record its atexit handler would have written
            from lockstep.forensics import recorder

            recorder.finished()
