"""In a rank: dump torch's flight recorder and every thread's Python stack into a folder
lockstep owns, when asked and on an uncaught exception. Design: docs/design/forensics.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from lockstep import compat  # imports no torch

DIR_ENV = "LOCKSTEP_FR_DIR"
PID_ENV = "LOCKSTEP_FR_RANK_PID"  # the pid of the rank whose watcher armed
TRIGGER = "dump.request"
POLL_S = 0.2
_installed: list[str] = []
_owner: list[int] = []  # the pid that armed: a fork inherits `_installed`, not the pid
_crashed: list[str] = []
_dumped: list[str] = []


def _rank() -> str:
    return os.environ.get("RANK", str(os.getpid()))


def _armed() -> bool:
    """The watcher is installed, by this process."""
    return bool(_installed) and _owner == [os.getpid()]


def _imported(name: str) -> bool:
    """`name` is fully imported (the main thread may hold its import lock mid-import)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _timed_out_in_last(data: bytes) -> bytes:
    """This rank's record with its last collective marked not completed: gloo counts one that
    timed out as completed."""
    import pickle

    record = pickle.loads(data)
    entries = [e for e in record.get("entries") or [] if not e.get("is_p2p")]
    if not entries:
        return data
    last = max(entries, key=lambda e: e.get("record_id", 0))
    pg = last.get("process_group") or (str(last.get("pg_id", 0)), "")
    status = (record.get("pg_status") or {}).get(str(pg[0]))
    seq = int(last.get("collective_seq_id") or 0)
    if isinstance(status, dict) and int(status.get("last_completed_collective", -1)) >= seq:
        status["last_completed_collective"] = seq - 1
        last["state"] = "started"  # and so its entry: analysis trusts a completed entry
        record["lockstep_timed_out_in"] = {"process_group": str(pg[0]), "collective_seq_id": seq}
    return pickle.dumps(record)


def dump(folder: str, why: str, exc=None, timed_out: bool = False) -> None:
    """Write this rank's flight recorder (first: a rank may be killed soon after), then its
    Python stacks, into `folder`; never raises."""
    import faulthandler

    rank = _rank()
    _dumped.append(why)
    data = None
    if _imported("torch") and _imported("torch.distributed"):  # else stacks only
        try:
            data = compat.dump_flight_recorder()
            if timed_out:
                data = _timed_out_in_last(data)
        except Exception:  # no process group, or a torch without the recorder
            data = None
    if data is not None:
        tmp = os.path.join(folder, f".rank_{rank}.tmp")
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, os.path.join(folder, f"rank_{rank}"))
        except OSError:
            pass
    # Renamed into place: the launcher may kill a rank the moment its stacks file exists.
    tmp = os.path.join(folder, f".rank_{rank}.stacks.tmp")
    try:
        with open(tmp, "w") as out:
            out.write(f"# {why}\n")
            if exc is not None:  # the main thread is in a hook now: the exception's own stack
                import traceback

                out.write("".join(traceback.format_exception(*exc)) + "\n")
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
        os.replace(tmp, os.path.join(folder, f"rank_{rank}.stacks"))
    except OSError:
        pass


def _watch(folder: str) -> None:
    trigger = os.path.join(folder, TRIGGER)
    while not os.path.exists(trigger):
        time.sleep(POLL_S)
    if _armed() and not _crashed and not _dumped:  # a dump made already stays
        dump(folder, "asked (the run timed out, or another rank crashed)")


def crash_dump(folder: str, why: str, exc=None, wait: float = 3.0, timed_out: bool = False) -> None:
    """This rank is crashing: dump, ask every other rank for its dump and wait up to `wait`
    seconds for them."""
    _crashed.append(why)
    # Dumped when asked: a crash now would overwrite the hang's stacks (a timeout marks its own).
    if timed_out or not _dumped:
        dump(folder, why, exc, timed_out)
    try:
        open(os.path.join(folder, TRIGGER), "a").close()
    except OSError:
        return
    world = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            done = sum(name.endswith(".stacks") for name in os.listdir(folder))
        except OSError:
            return
        if done >= world:
            return
        time.sleep(0.05)


def timed_out(why: str, wait: float = 3.0) -> None:
    """A collective of this rank gave up on its own timeout: dump and ask the others, as a
    crash does."""
    if _armed() and not _crashed:
        crash_dump(_installed[0], why[:500], wait=wait, timed_out=True)


def install(folder: str) -> None:
    """Start the watcher thread and the dump on an uncaught exception, once per process."""
    if not folder or folder in _installed or not os.path.isdir(folder):
        return
    _installed.append(folder)
    _owner[:] = [os.getpid()]
    os.environ[PID_ENV] = str(os.getpid())
    threading.Thread(target=_watch, args=(folder,), name="lockstep-fr", daemon=True).start()
    previous = sys.excepthook

    def hook(kind, value, tb):
        if _armed() and not issubclass(kind, KeyboardInterrupt | SystemExit):
            crash_dump(folder, f"uncaught {kind.__name__}: {value}"[:500], (kind, value, tb))
        previous(kind, value, tb)

    sys.excepthook = hook
    atexit.register(_at_exit, folder)


def _at_exit(folder: str) -> None:
    """A rank that ends, even cleanly, leaves its record (a mismatch gloo let through)."""
    if _armed() and not _crashed and not _dumped:
        dump(folder, "at exit")


def finished() -> None:
    """The rank's function returned (a forked rank, which ends without atexit)."""
    if _armed():
        _at_exit(_installed[0])


def dump_on_error(info) -> None:
    """Dump for an exception a runner caught itself (a forked rank's script)."""
    kind, value = info[0], info[1]
    if not _armed() or _crashed or kind is None:
        return
    if not issubclass(kind, KeyboardInterrupt | SystemExit):
        crash_dump(_installed[0], f"uncaught {kind.__name__}: {value}"[:500], info)


def run(fn, *args):
    """`fn(*args)` recorded: a dump on an exception it raises (torchelastic catches it, not the
    excepthook) and at its return."""
    install_from_env()
    try:
        result = fn(*args)
    except BaseException:
        dump_on_error(sys.exc_info())
        raise
    finished()
    return result


def install_from_env() -> None:
    """Install the watcher when the launch asked for dumps, in a rank's own process only."""
    mark = os.environ.get(PID_ENV)
    if "RANK" not in os.environ or (mark and mark != str(os.getpid())):
        return
    install(os.environ.get(DIR_ENV, ""))
