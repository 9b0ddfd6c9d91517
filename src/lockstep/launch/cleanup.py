"""Nothing outlives a launch: folders, signal handlers, processes (even when this one is
SIGKILLed); and what a signal that stops a command becomes. Design: docs/design/launch.md
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from lockstep.compat import ELASTIC_SIGNALS_ENV, quick_rendezvous_event_names

# the signals torchelastic's launch turns into its SignalException
LAUNCH_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def stopped_by(signum: int) -> BaseException:
    """KeyboardInterrupt for SIGINT (exit 130), else a one-line error exiting 128 + signum."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    from lockstep.errors import LockstepError

    return LockstepError(f"stopped by {signal.Signals(signum).name}", 128 + signum)


@contextlib.contextmanager
def signals_raise(*names: str):
    """While inside (main thread only): `names` raise `stopped_by`, so `finally` blocks run."""
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
    """While inside (main thread only): `names` are held; the first is raised after."""
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
def launch_scope():
    """Around one torchelastic launch: yields its LogsSpecs, a folder (and `tempfile.tempdir`)
    removed after; torchelastic's signal handling put back."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException

    quick_rendezvous_event_names()  # torchelastic's own walks the stack for every event
    saved = {}
    main = threading.current_thread() is threading.main_thread()
    if main:
        saved = {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in LAUNCH_SIGNALS)}
    saved_env = os.environ.get(ELASTIC_SIGNALS_ENV)
    folder = tempfile.mkdtemp(prefix="lockstep-launch-")
    saved_tempdir = tempfile.tempdir
    if main:
        tempfile.tempdir = folder
    try:
        yield DefaultLogsSpecs(log_dir=folder)
    except SignalException as exc:
        raise stopped_by(exc.sigval) from None
    finally:
        if main:  # tempdir is process-wide: put back only what this launch set
            tempfile.tempdir = saved_tempdir
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if saved_env is None:
            os.environ.pop(ELASTIC_SIGNALS_ENV, None)
        else:
            os.environ[ELASTIC_SIGNALS_ENV] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def pdeathsig(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """This process gets `sig` when its parent ends (Linux); if `parent` is gone, it ends now."""
    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))


# a rank's program: PR_SET_PDEATHSIG (kept across exec), then exec the real one
EXEC_DYING_WITH_PARENT = """\
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

# another launcher's session leader: when lockstep ends, SIGTERM to the group (the deepspeed
# launcher ends its ranks on it), up to 10 s for the launcher, then SIGKILL to what is left
KEEP_SESSION = """\
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


def dying_with_parent(program: str, args: list) -> tuple[str, list]:
    """`program args` as a rank's program that dies with this process."""
    if sys.platform != "linux":
        return program, args
    return sys.executable, ["-I", "-S", "-c", EXEC_DYING_WITH_PARENT, str(os.getpid()),
                            program, *args]  # fmt: skip


def keeping_session(command: list[str]) -> list[str]:
    """`command` under a session keeper: its whole process group ends with this process."""
    if sys.platform != "linux":
        return command
    return [sys.executable, "-I", "-S", "-c", KEEP_SESSION, str(os.getpid()), *command]


def spawned_rank(parent: int, fn, *args):
    """A spawned rank's entry point, dying with the launching process."""
    pdeathsig(signal.SIGKILL, parent)
    return fn(*args)


def die_with(pid: int, interval: float = 0.5) -> None:
    """SIGKILL this process once `pid` is gone: a forked rank's parent is the forkserver."""
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


def killer():
    """A function that SIGKILLs every process this one starts from now on."""
    import psutil

    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}

    def kill() -> None:
        for child in me.children(recursive=True):
            if child.pid not in before:
                with contextlib.suppress(psutil.Error):
                    child.kill()

    return kill


def end_group(proc: subprocess.Popen, grace: float) -> None:
    """End `proc`'s process group: SIGTERM, `grace` seconds for `proc`, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace or 30)


def owned_tempdir(prefix: str, suffix: str = "") -> str:
    """A new temporary folder named with this process's pid, for `orphaned_tempdirs`."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{suffix}")


def orphaned_tempdirs(prefix: str) -> list[str]:
    """The `owned_tempdir`s of `prefix` whose process is gone."""
    found = []
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name.removeprefix(prefix).split("-")[0] if name.startswith(prefix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            found.append(os.path.join(root, name))
    return found
