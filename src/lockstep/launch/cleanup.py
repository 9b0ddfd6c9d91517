"""Nothing outlives a launch: each one's torchelastic folder (its ranks' error.json) and the
error files torch.multiprocessing makes for forked ranks live in a temporary folder removed
after it; torchelastic's signal handlers are restored after it (a
SIGINT during it ends in KeyboardInterrupt, exit 130, not its SignalException); a rank started
as a new process, and another launcher's whole process group, die with this process even when
it is SIGKILLed (`PR_SET_PDEATHSIG`); a forked rank watches it (`die_with`).

Also what a signal that stops a command becomes (`stopped_by`), and the context managers that
make one raise it (`signals_raise`) or hold it until a cleanup is done (`signals_deferred`).
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
def launch_scope():
    """Around one torchelastic launch: yields the LogsSpecs for its LaunchConfig, whose folder
    (torchelastic's `torchelastic_*` under /tmp otherwise, never removed, with each failed
    rank's raw traceback in error.json) is a temporary one removed after. So are the error
    files torch.multiprocessing's `start_processes` makes for function ranks
    (`pytorch-errorfile-*.pickle`, delete=False, a failed rank's traceback in it): during a
    launch from the main thread, as lockstep's are, that folder is the process's temporary
    folder (`tempfile.tempdir`; process-wide, so never from another thread). The signal
    handlers torchelastic installs (`PContext.start`) and its TORCHELASTIC_SIGNALS_TO_HANDLE
    are put back as they were, and its SignalException becomes `stopped_by` the signal."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException

    quick_rendezvous_event_names()  # torchelastic's own names each event with inspect.stack()
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
        if main:  # another thread's launch never puts back a value it did not set
            tempfile.tempdir = saved_tempdir
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if saved_env is None:
            os.environ.pop(ELASTIC_SIGNALS_ENV, None)
        else:
            os.environ[ELASTIC_SIGNALS_ENV] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def pdeathsig(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
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

# `python -c` run as another launcher's session leader: the launcher as its child, in the same
# process group; when this process's parent ends (lockstep, SIGKILL included) it gets SIGTERM
# (PR_SET_PDEATHSIG) and ends the whole group: SIGTERM (the deepspeed launcher ends its ranks
# on it), then, once the launcher has exited (10 s at most), SIGKILL for what is left of the
# group. Its exit code is the launcher's.
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
    """`program args` as a rank's program that dies with this process (`EXEC_DYING_WITH_PARENT`)."""
    if sys.platform != "linux":
        return program, args
    return sys.executable, ["-I", "-S", "-c", EXEC_DYING_WITH_PARENT, str(os.getpid()),
                            program, *args]  # fmt: skip


def keeping_session(command: list[str]) -> list[str]:
    """`command` run under a session keeper (`KEEP_SESSION`): its whole process group ends with
    this process, SIGKILL included."""
    if sys.platform != "linux":
        return command
    return [sys.executable, "-I", "-S", "-c", KEEP_SESSION, str(os.getpid()), *command]


def spawned_rank(parent: int, fn, *args):
    """A spawned rank's entry point: die with the launching process, then `fn(*args)`."""
    pdeathsig(signal.SIGKILL, parent)
    return fn(*args)


def die_with(pid: int, interval: float = 0.5) -> None:
    """End this process (SIGKILL) once process `pid` is gone: a rank forked from the
    forkserver outlives the process that asked for it otherwise (its parent is the forkserver,
    which in turn lives as long as any process it forked)."""
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


def end_group(proc: subprocess.Popen, grace: float) -> None:
    """End `proc`'s process group: SIGTERM, up to `grace` seconds for `proc` to exit, then
    SIGKILL for all that is left of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace or 30)


def owned_tempdir(prefix: str, suffix: str = "") -> str:
    """A new temporary folder named after this process (`prefix` PID `-` ...), so that a later
    run finds it orphaned when this process dies unable to remove it (SIGKILL)."""
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
