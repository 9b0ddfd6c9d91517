"""Work that a session fixture does once per test run, not once per pytest-xdist worker.

pytest-xdist gives each worker its own session, so a session fixture used by tests on both
workers would launch its trainings twice. The recipe of xdist's documentation: the first
worker does the work under a file lock in the folder the workers of one run share; the others
wait for it and read what it left.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder `make(folder)` filled, once for the whole run; every worker gets the same one."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            make(folder)
            done.touch()
    return folder
