"""In a rank: dump torch's flight recorder into a folder lockstep owns.

A rank blocked in a gloo collective has its main thread inside C++ (a Python signal handler
would never run), but the GIL is released while it waits: a daemon thread polling for a
trigger file in the folder runs, and writes `rank_N` (the pickled dump) and `rank_N.stacks`
(every thread's Python stack, faulthandler's). An uncaught exception (gloo's "Received data
size doesn't match expected size" raised in a rank) dumps too, before the interpreter's
own report. Standard library only at import time; torch is imported when a dump is written.
"""

from __future__ import annotations

import os
import sys
import threading
import time

DIR_ENV = "LOCKSTEP_FR_DIR"
TRIGGER = "dump.request"
POLL_S = 0.2
_installed: list[str] = []


def _rank() -> str:
    return os.environ.get("RANK", str(os.getpid()))


def dump(folder: str, why: str) -> None:
    """Write this rank's flight recorder and Python stacks into `folder` (never raises)."""
    import faulthandler

    rank = _rank()
    try:
        with open(os.path.join(folder, f"rank_{rank}.stacks"), "w") as out:
            out.write(f"# {why}\n")
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
    except OSError:
        pass
    try:
        from lockstep import compat

        data = compat.dump_flight_recorder()
    except Exception:  # no process group, or a torch without the recorder
        return
    tmp = os.path.join(folder, f".rank_{rank}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
        os.replace(tmp, os.path.join(folder, f"rank_{rank}"))
    except OSError:
        pass


def _watch(folder: str) -> None:
    trigger = os.path.join(folder, TRIGGER)
    while not os.path.exists(trigger):
        time.sleep(POLL_S)
    dump(folder, "lockstep asked (the run timed out)")


def install(folder: str) -> None:
    """Start the watcher thread and the dump on an uncaught exception, once per process."""
    if not folder or folder in _installed or not os.path.isdir(folder):
        return
    _installed.append(folder)
    threading.Thread(target=_watch, args=(folder,), name="lockstep-fr", daemon=True).start()
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt | SystemExit):
            dump(folder, f"uncaught {kind.__name__}: {value}"[:500])
        previous(kind, value, tb)

    sys.excepthook = hook


def install_from_env() -> None:
    install(os.environ.get(DIR_ENV, ""))
