"""Start N ranks on this machine through torchrun, as `--standalone` does.

In-process through torchrun's launcher API for `lockstep preflight --nproc N` and `lockstep
train --nproc N` (`run_local`): a c10d rendezvous on the loopback with a port the OS picks
(never a fixed port), no restarts. As a command for a user's script or a job whose code comes
from elsewhere (`check --script`, `gate`): `torchrun_command` and `run_launcher`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

# libstdc++'s std::terminate message: a joinable std::thread destroyed at exit (gloo's
# threads, when the process group was never destroyed; see README, "The protocol").
ABORT_SIGNATURE = "terminate called without an active exception"
# faulthandler's report of an abort inside running Python code (at exit there is none, or
# "<no Python frame>")
IN_PYTHON = re.compile(
    r"Fatal Python error: Aborted\s*\n\s*\n[^\n]*most recent call first[^\n]*\n\s+File "
)
# the launchers' summaries of each failed rank (torchrun, then the deepspeed launcher)
EXIT_CODES = re.compile(r"exitcode\s*:\s*(-?\d+)|exits with return code = (-?\d+)")


def standalone_config(nproc: int, name: str, **overrides):
    """A LaunchConfig for `nproc` local ranks; `overrides` set any other LaunchConfig field."""
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


def run_local(fn, args: tuple, nproc: int, name: str, **overrides) -> dict:
    """Run `fn(*args)` on `nproc` spawned local ranks; {rank: return value}.

    A rank that fails (an exception, a signal) ends in one LockstepError naming it; its
    traceback was already printed by torchelastic's error handler.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, LockstepError

    config = standalone_config(nproc, name, start_method="spawn", **overrides)
    try:
        with scrubbed_logs():
            return elastic_launch(config, fn)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise LockstepError(
            f"rank {rank} failed with exit code {failure.exitcode}; its traceback is above",
            EXIT_FAIL,
        ) from None


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """torchrun (standalone, no restarts) starting `argv` on `nproc` local ranks: a `.py`
    script or `-m module` under this interpreter, anything else as a program of its own."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), "--max-restarts", "0"]  # fmt: skip
    python = argv[0].endswith(".py") or argv[0] == "-m"
    return [*launcher, *argv] if python else [*launcher, "--no-python", *argv]


def run_launcher(command: list[str], log: Path, *, env: dict, timeout: float,
                 cwd: Path | None = None, watch=None) -> int | None:  # fmt: skip
    """Run a launcher command in its own process group, its output (every rank's) redacted
    into `log`; its exit code, or None when it ran past `timeout` and the whole group was
    killed. `watch(pid)`, a context manager, runs around the wait (gate's process monitor)."""
    from lockstep.redact import scrubbed_log

    with scrubbed_log(log) as out:  # the job's own output may quote a secret
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)  # fmt: skip
        with watch(proc.pid) if watch else contextlib.nullcontext():
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None


def aborted_at_exit(text: str) -> bool:
    """A launch's log shows only the known gloo abort at interpreter exit: the std::terminate
    message, no Python frame running, and every failed rank died of SIGABRT (-6) or of the
    SIGTERM its launcher then sent. Whether the run was complete is the caller's to judge."""
    codes = {a or b for a, b in EXIT_CODES.findall(text)}
    only_aborts = not codes or ("-6" in codes and codes <= {"-6", "-15"})
    return ABORT_SIGNATURE in text and not IN_PYTHON.search(text) and only_aborts


def last_error_line(log: Path) -> str:
    """The script's own last error line, not the launcher's summary of it."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    launcher = ("errors.html", "ChildFailedError", "elastic", "launch.py", "error_file")
    errors = [
        ln for ln in lines
        if ("Error" in ln or "error" in ln) and not any(x in ln for x in launcher)
    ]  # fmt: skip
    return (errors or lines or ["no output"])[-1][:300]
