"""Start N ranks on this machine through torchrun's launcher API, as `torchrun --standalone`
does, in this process: a c10d rendezvous on the loopback with a port the OS picks, no restarts.

- `run_local`: a function on each rank (`train --nproc N`, `check NAME CONFIG`);
- `run_local_cli`: `python -m lockstep ...` on each rank (`preflight --nproc N`);
- `run_command`: a user's script or a job whose code comes from elsewhere (`check --script`,
  `gate`), every rank's output into one redacted log, with a timeout;
- `run_launcher`: another launcher's command (the deepspeed launcher) in its own process group.

`rank_environment` sets what ranks need before torch and DeepSpeed start. Which launcher
started *this* process is `lockstep.env.launcher`.

Nothing outlives a launch: each one's torchelastic folder (its ranks' error.json) lives in a
temporary folder removed after it; torchelastic's signal handlers are restored after it (a
SIGINT during it ends in KeyboardInterrupt, exit 130, not its SignalException); a rank started
as a new process, and another launcher's whole process group, die with this process even when
it is SIGKILLed (`PR_SET_PDEATHSIG`); a forked rank watches it (`die_with`).

On CPU, `run_local`'s ranks are forked from a forkserver that imported torch, transformers and
DeepSpeed once (its preload), instead of each spawned rank importing them again (2-6 s of CPU
each): the forkserver is a single-threaded process that ran no torch op, so its children start
clean (a fork of a process whose OpenMP pool ran hangs in the child). On GPUs they are spawned,
so no parent ever touches CUDA before a rank.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import MutableMapping
from pathlib import Path

# libstdc++'s std::terminate message: a gloo worker thread made to exit by Python's
# finalization inside a noexcept destructor (README, "The protocol"; `track.finish`).
ABORT_SIGNATURE = "terminate called without an active exception"
# faulthandler's report of an abort inside running Python code (at exit there is none, or
# "<no Python frame>")
IN_PYTHON = re.compile(
    r"Fatal Python error: Aborted\s*\n\s*\n[^\n]*most recent call first[^\n]*\n\s+File "
)
# the launchers' summaries of each failed rank (torchrun, then the deepspeed launcher)
EXIT_CODES = re.compile(r"exitcode\s*:\s*(-?\d+)|exits with return code = (-?\d+)")


def rank_environment(
    device: str | None, nproc: int | None = None, env: MutableMapping[str, str] | None = None
) -> None:
    """Set in `env` (default os.environ) what ranks need before torch and DeepSpeed start:
    DeepSpeed's CPU accelerator when `device` is "cpu" (its probe would pick CUDA on a GPU
    machine), and with `nproc` ranks on this machine an even share of its cores each
    (OMP_NUM_THREADS, unless set)."""
    env = os.environ if env is None else env
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    if nproc:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))


def standalone_config(nproc: int, name: str, **overrides):
    """A LaunchConfig for `nproc` local ranks; `overrides` set any other LaunchConfig field.
    Without `logs_specs` torchelastic makes a `torchelastic_*` folder it never removes: pass
    the one `_launch()` yields."""
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


# The signals torchelastic's launch turns into its SignalException (LaunchConfig's default).
LAUNCH_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def stopped_by(signum: int) -> BaseException:
    """What a signal that stops a command becomes: KeyboardInterrupt for SIGINT (the CLI's
    exit 130), otherwise a one-line error with the shell's exit code for it, 128 + signum."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    from lockstep.errors import LockstepError

    return LockstepError(f"stopped by {signal.Signals(signum).name}", 128 + signum)


@contextlib.contextmanager
def signals_raise(*names: str):
    """While inside (main thread only): `names` (default SIGTERM, SIGHUP) raise `stopped_by`
    in the main thread, so `finally` blocks run instead of the process just ending; the
    previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise stopped_by(signum)

    sigs = [getattr(signal, n) for n in names or ("SIGTERM", "SIGHUP")]
    saved = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred(*names: str):
    """While inside (main thread only): `names` (default SIGINT, SIGTERM, SIGHUP) are held,
    so a cleanup runs to its end; the first one that came is raised after (`stopped_by`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    sigs = [getattr(signal, n) for n in names or ("SIGINT", "SIGTERM", "SIGHUP")]
    saved = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if came:
            raise stopped_by(came[0])


@contextlib.contextmanager
def _launch():
    """Around one torchelastic launch: yields the LogsSpecs for its LaunchConfig, whose folder
    (torchelastic's `torchelastic_*` under /tmp otherwise, never removed, with each failed
    rank's raw traceback in error.json) is a temporary one removed after. The signal handlers
    torchelastic installs (`PContext.start`) and its TORCHELASTIC_SIGNALS_TO_HANDLE are put
    back as they were, and its SignalException becomes `stopped_by` the signal."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException

    saved = {}
    if threading.current_thread() is threading.main_thread():
        saved = {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in LAUNCH_SIGNALS)}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    folder = tempfile.mkdtemp(prefix="lockstep-launch-")
    try:
        yield DefaultLogsSpecs(log_dir=folder)
    except SignalException as exc:
        raise stopped_by(exc.sigval) from None
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if saved_env is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def _pdeathsig(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """This process gets `sig` when its parent (the thread that started it) ends, SIGKILL
    included (Linux's PR_SET_PDEATHSIG); if `parent` is already gone, it ends now."""
    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))


# `python -c` run as a rank's program: PR_SET_PDEATHSIG (kept across exec), then exec the real
# program. stdlib only, `-I -S`: about 10 ms.
_EXEC_DYING_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as err:
    print(f"lockstep: cannot run {sys.argv[2]!r}: {err.strerror}", file=sys.stderr, flush=True)
    os._exit(127)
"""

# `python -c` run as another launcher's session leader: the launcher as its child, in the same
# process group; when this process's parent ends (lockstep, SIGKILL included) it gets SIGTERM
# (PR_SET_PDEATHSIG) and ends the whole group: SIGTERM (the deepspeed launcher ends its ranks
# on it), then, once the launcher has exited (10 s at most), SIGKILL for what is left of the
# group. Its exit code is the launcher's.
_KEEP_SESSION = """\
import ctypes, os, signal, subprocess, sys
class Stop(Exception):
    pass
def stop(signum, frame):
    raise Stop
signal.signal(signal.SIGTERM, stop)
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
try:
    if os.getppid() != int(sys.argv[1]):
        raise Stop
    pid = subprocess.Popen(sys.argv[2:]).pid
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
except Stop:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    try:
        os.waitpid(pid, 0)
    except (NameError, ChildProcessError, Stop):
        pass
    os.killpg(0, signal.SIGKILL)
sys.exit(code if code >= 0 else 128 - code)
"""


def _dying_with_parent(program: str, args: list) -> tuple[str, list]:
    """`program args` as a rank's program that dies with this process (`_EXEC_DYING_WITH_PARENT`)."""
    if sys.platform != "linux":
        return program, args
    return sys.executable, ["-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()),
                            program, *args]  # fmt: skip


def _spawned_rank(parent: int, fn, *args):
    """A spawned rank's entry point: die with the launching process, then `fn(*args)`."""
    _pdeathsig(signal.SIGKILL, parent)
    return fn(*args)


class _Scrub(logging.Filter):
    """Rewrites a record as its redacted text (message and traceback): torchelastic logs a
    failed rank's exception, whose text may hold a secret, through its own logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        from lockstep.redact import scrub_text

        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        elif record.exc_text:
            text += "\n" + record.exc_text
        record.msg, record.args = scrub_text(text), ()
        record.exc_info = record.exc_text = None
        return True


@contextlib.contextmanager
def scrubbed_logs(logger: str = "torch.distributed.elastic"):
    """While inside: every handler that records of `logger` and its children reach redacts
    them first (a handler's filter, unlike a logger's, sees its children's records too)."""
    handlers, log = {logging.lastResort} - {None}, logging.getLogger(logger)
    for name, child in list(logging.root.manager.loggerDict.items()):
        if name.startswith(logger + ".") and isinstance(child, logging.Logger):
            handlers.update(child.handlers)
    while log:
        handlers.update(log.handlers)
        log = log.parent if log.propagate else None
    scrub = _Scrub()
    for handler in handlers:
        handler.addFilter(scrub)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(scrub)


# What every forked rank has imported: torch._dynamo too, which the first optimizer a process
# builds imports (2 s of CPU here, as much as torch itself).
BASE_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "lockstep.track", __name__]
# The environment the forkserver of this process started with (None: not started by us).
_forkserver_environ: dict[str, str] | None = None


def _forkserver(preload: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Start this process's forkserver with `BASE_PRELOAD` and `preload` imported, then frozen
    out of the garbage collector's reach (`lockstep.gc_freeze`); once: later calls reuse it,
    whatever they preload. Returns the environment it started with."""
    global _forkserver_environ
    if _forkserver_environ is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*BASE_PRELOAD, *preload, "lockstep.gc_freeze"])
        _forkserver_environ = dict(os.environ)
        forkserver.ensure_running()
    return _forkserver_environ


def die_with(pid: int, interval: float = 0.5) -> None:
    """End this process (SIGKILL) once process `pid` is gone: a rank forked from the
    forkserver outlives the process that asked for it otherwise (its parent is the forkserver,
    which in turn lives as long as any process it forked)."""
    import threading
    import time

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)
            except PermissionError:
                pass
            time.sleep(interval)

    threading.Thread(target=watch, name="lockstep-die-with", daemon=True).start()


def forkserver_context(preload: list[str] | tuple[str, ...] = ()):
    """The "forkserver" multiprocessing context, its server started (`BASE_PRELOAD` and
    `preload` imported; or already running): for CPU ranks that must not pay torch's import
    each. The server never ran a torch op, so a rank may still use CUDA; nothing it imports
    may initialize CUDA (no GPU probe), or forked ranks could not use it."""
    _forkserver(preload)
    return multiprocessing.get_context("forkserver")


class _Launcher:
    """The launching process as a forked rank needs it: its pid, its environment and its
    stdout/stderr now (the forkserver has those of when it started). Pickled for the rank,
    the two file descriptors travel as multiprocessing passes a Connection's (`DupFd`)."""

    def __init__(self, server: dict[str, str], environ: dict[str, str], pid=None, fds=None):
        self.server, self.environ, self.pid, self.fds = server, environ, pid or os.getpid(), fds

    def __reduce__(self):
        from multiprocessing import reduction

        fds = (reduction.DupFd(1), reduction.DupFd(2))
        return _Launcher, (self.server, self.environ, self.pid, fds)

    def adopt(self) -> None:
        """On the rank: the launcher's stdout/stderr and environment of now, keeping what
        torchelastic set for this rank; the rank ends when the launcher does."""
        die_with(self.pid)
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


def _in_environ(launcher: _Launcher, fn, *args):
    """A forked rank's entry point: `launcher.adopt()`, then `fn(*args)`."""
    launcher.adopt()
    return fn(*args)


def run_local(fn, args: tuple, nproc: int, name: str, device: str, preload=(), **overrides):
    """Run `fn(*args)` on `nproc` local ranks for `device`; rank 0's return value.

    On CPU the ranks fork from a forkserver that imported `preload` (module names) once; on
    GPUs they are spawned. A rank may return a LockstepError instead of raising it: the first
    such one, in rank order, is raised here. A rank that fails (an exception, a signal) ends in
    one LockstepError naming it; its traceback was already printed by torchelastic's error
    handler.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, LockstepError

    rank_environment(device, nproc)
    if device == "cpu":
        server = _forkserver(preload)
        entry, args = _in_environ, (_Launcher(server, dict(os.environ)), fn, *args)
        overrides["start_method"] = "forkserver"
    else:
        entry, args = _spawned_rank, (os.getpid(), fn, *args)
        overrides["start_method"] = "spawn"
    try:
        with _launch() as logs, scrubbed_logs():
            config = standalone_config(nproc, name, logs_specs=logs, **overrides)
            results = elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise LockstepError(
            f"rank {rank} failed with exit code {failure.exitcode}; its traceback is above",
            EXIT_FAIL,
        ) from None
    for rank in sorted(results):
        if isinstance(results[rank], LockstepError):
            raise results[rank]
    return results[0]


def run_local_cli(nproc: int, argv: list[str]) -> int:
    """Run `python -m lockstep *argv` on `nproc` local ranks; the exit code they agree on
    (rank 0 decides it), or EXIT_TIMEOUT when a rank was killed by a signal (a missing rank)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE

    # The agent's own INFO/WARNING lines (and its failure dump) repeat what rank 0 prints.
    agent = logging.getLogger("torch.distributed.elastic")
    level = agent.level
    agent.setLevel(logging.CRITICAL)
    program, args = _dying_with_parent(sys.executable, ["-m", "lockstep", *argv])
    try:
        with _launch() as logs:
            elastic_launch(standalone_config(nproc, argv[0], logs_specs=logs), program)(*args)
    except ChildFailedError as err:
        codes = {f.exitcode for f in err.failures.values()}
        return max(codes) if codes <= {EXIT_FAIL, EXIT_USAGE, EXIT_TIMEOUT} else EXIT_TIMEOUT
    finally:
        agent.setLevel(level)  # a later launch in this process reports its ranks' failures
    return EXIT_OK


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """torchrun's entrypoint for `argv`: a `.py` script or `-m module` under this interpreter
    (unbuffered, as torchrun runs it), anything else as a program of its own."""
    if argv[0].endswith(".py") or argv[0] == "-m":
        return sys.executable, ["-u", *argv]
    return argv[0], argv[1:]


@contextlib.contextmanager
def _job_process(env: dict, cwd: Path | None, log):
    """While inside: this process has the job's environment and folder, and its stdout and
    stderr go to `log` (so do the ranks' it starts, which inherit them); all restored after."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    sys.stdout.flush(), sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, saved in zip((1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _killer():
    """A function that SIGKILLs every process this one started from now on (the ranks and
    whatever they start), leaving alone the ones it had already (a forkserver)."""
    import psutil

    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}

    def kill() -> None:
        for child in me.children(recursive=True):
            if child.pid not in before:
                with contextlib.suppress(psutil.Error):
                    child.kill()

    return kill


def _exit_through_return(code: int = 0):
    """`os._exit` for a script in a forked rank: torchelastic's function mode needs the rank's
    function to return (an exit without its return value looks like a rank still running), and
    the rank process itself then ends with `os._exit`, without Python's finalization."""
    sys.stdout.flush(), sys.stderr.flush()
    raise SystemExit(code)


def _run_script(log: str, cwd: str, script: str, *args: str) -> None:
    """On a forked rank: run `script` as `__main__` with `args`, as `python -u script args`
    would in `cwd` (its folder first on sys.path; `-m module args`: the module, `cwd` first),
    its output appended to `log`."""
    import faulthandler
    import runpy

    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1), os.dup2(fd, 2), os.close(fd)
    sys.stdout.reconfigure(write_through=True), sys.stderr.reconfigure(write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    os.chdir(cwd)
    os._exit = _exit_through_return
    if script == "-m":
        sys.argv = list(args)  # runpy puts the module's file first, as python -m does
        sys.path.insert(0, cwd)
        run = lambda: runpy.run_module(args[0], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    try:
        run()
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()  # as the interpreter prints it, before torchelastic's summary
        raise


def run_command(argv: list[str], nproc: int, log: Path, *, env: dict, timeout: float,
                cwd: Path | None = None, watch=None, run_path: bool = False) -> int | None:  # fmt: skip
    """Run `argv` on `nproc` local ranks as `torchrun --standalone` would, through its launcher
    API in this process (no launcher process importing torch again); every rank's output and
    the launcher's into `log`, redacted. The exit code (0, or the first failed rank's), or None
    when it ran past `timeout` and every rank was killed. `watch(pid)`, a context manager,
    runs around the launch with this process's pid (gate's process monitor).

    `run_path` (a `.py` script): as `torchrun --run-path`, each rank runs the script with
    runpy in a process that already imported torch (`BASE_PRELOAD`), forked from this
    process's forkserver, instead of a new interpreter importing it again (about 3 s of CPU a
    rank here). What the script does before `import torch` for torch to read at import time
    is then too late; `os._exit(n)` ends the script as `sys.exit(n)` would.
    """
    import threading

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import UsageError
    from lockstep.redact import scrubbed_log

    if run_path:
        if not (argv[0].endswith(".py") or argv[0] == "-m"):
            raise UsageError(f"--run-path runs a Python script (script.py ...), not {argv[0]!r}")
        server = _forkserver()  # before _killer: it stays
        program = _in_environ
        args = [_Launcher(server, env), _run_script, str(log), str(cwd or os.getcwd()), *argv]
        start = {"start_method": "forkserver"}
    else:
        program, args = _dying_with_parent(*_program(argv))
        start = {}
    expired, kill = [], _killer()
    timer = threading.Timer(timeout, lambda: (expired.append(True), kill()))
    timer.daemon = True
    watching = watch(os.getpid()) if watch else contextlib.nullcontext()
    with scrubbed_log(log) as out, _launch() as logs, _job_process(env, cwd, out), \
            scrubbed_logs(), watching:  # fmt: skip
        config = standalone_config(nproc, "script", logs_specs=logs, **start)
        timer.start()
        try:
            elastic_launch(config, program)(*args)
            code = 0
        except ChildFailedError as err:
            out.write(f"{err.format_msg()}\n".encode())  # as torchrun prints it
            out.flush()
            code = err.get_first_failure()[1].exitcode or 1
        except BaseException:
            kill()  # interrupted: whatever a rank started in a session of its own too
            raise
        finally:
            timer.cancel()
    return None if expired else code


def run_launcher(command: list[str], log: Path, *, env: dict, timeout: float,
                 cwd: Path | None = None, watch=None) -> int | None:  # fmt: skip
    """Run a launcher command in its own process group, its output (every rank's) redacted
    into `log`; its exit code, or None when it ran past `timeout` and the whole group was
    killed. `watch(pid)`, a context manager, runs around the wait (gate's process monitor).

    The group ends with this process: on an interrupt (Ctrl-C, a signal made an exception)
    before the log is closed, and, through a session keeper (`_KEEP_SESSION`), when this
    process is killed."""
    from lockstep.redact import scrubbed_log

    if sys.platform == "linux":
        command = [sys.executable, "-I", "-S", "-c", _KEEP_SESSION, str(os.getpid()), *command]
    with scrubbed_log(log) as out:  # the job's own output may quote a secret
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)  # fmt: skip
        try:
            with watch(proc.pid) if watch else contextlib.nullcontext():
                try:
                    return proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _end_group(proc, grace=0)
                    return None
        except BaseException:
            _end_group(proc, grace=10)
            raise


def _end_group(proc: subprocess.Popen, grace: float) -> None:
    """End `proc`'s process group: SIGTERM, up to `grace` seconds for `proc` to exit, then
    SIGKILL for all that is left of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace or 30)


def aborted_at_exit(text: str) -> bool:
    """A launch's log shows only the known gloo abort at interpreter exit: the std::terminate
    message, no Python frame running, and every failed rank died of SIGABRT (-6) or of the
    SIGTERM its launcher then sent. Whether the run was complete is the caller's to judge."""
    codes = {a or b for a, b in EXIT_CODES.findall(text)}
    only_aborts = not codes or ("-6" in codes and codes <= {"-6", "-15"})
    return ABORT_SIGNATURE in text and not IN_PYTHON.search(text) and only_aborts


# torchrun's failure summary: a block between two lines of 60 "=" (ChildFailedError.format_msg)
SUMMARY = re.compile(r"^={60}$.*?^={60}$", re.M | re.S)


def last_error_line(log: Path) -> str:
    """The script's own last error line, not the launcher's summary of it."""
    text = SUMMARY.sub("", log.read_text(errors="replace"))
    launcher = ("errors.html", "ChildFailedError", "elastic", "launch.py", "error_file")
    lines = [
        ln.strip() for ln in text.splitlines()
        if ln.strip() and not any(x in ln for x in launcher)
    ]  # fmt: skip
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["no output"])[-1][:300]
