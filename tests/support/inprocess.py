"""`lockstep.cli.main` inside the test process, as `python -m lockstep` would run it (its
folder first on sys.path).

The same code as the console script (tests/test_cli.py starts that one for real) without a new
interpreter importing torch for every call: a script check's ranks still start as fresh
processes, and a CONFIG check's ranks fork from the forkserver this process started once.
The call gets its own working directory, environment, stdout and stderr (file descriptors
included, which the launched ranks inherit), all restored after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lockstep.cli import main


@contextlib.contextmanager
def _captured():
    """File descriptors 1 and 2 into two temporary files, and Python's stdout and stderr (and
    the logging handlers that held the old ones: torch's own) writing to those descriptors, as
    in a process of its own; their texts land in the list it yields when the block ends."""
    texts: list[str] = []
    with contextlib.ExitStack() as files:
        out, err = (files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2))
        sys.stdout.flush(), sys.stderr.flush()
        saved_fds, saved_streams = [os.dup(1), os.dup(2)], (sys.stdout, sys.stderr)
        moved = [
            (handler, handler.stream)
            for handler in _stream_handlers()
            if handler.stream in saved_streams
        ]
        streams = [open(fd, "w", buffering=1, closefd=False) for fd in (1, 2)]  # noqa: SIM115
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = streams
            for handler, stream in moved:
                handler.setStream(streams[0] if stream is saved_streams[0] else streams[1])
            yield texts
        finally:
            for stream in streams:
                stream.flush()
            for handler, stream in moved:
                handler.setStream(stream)
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            out.seek(0), err.seek(0)
            texts += [out.read(), err.read()]


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    return [
        h for lg in loggers for h in lg.handlers
        if type(h) is logging.StreamHandler
    ]  # fmt: skip


@contextlib.contextmanager
def _warnings_to_stderr():
    """Log records of WARNING and above to stderr, as a bare interpreter's last-resort handler
    prints them (pytest's own handlers on the root logger keep that one from firing)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)


def run_main(argv: list[str], cwd: Path, env: dict[str, str] | None = None, *, environ=None):
    """`lockstep *argv` in `cwd` with `env` added to the environment (or `environ` instead of
    it); a CompletedProcess."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(env or {})
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))  # as `python -m lockstep` has its folder first
    try:
        with _captured() as texts, _warnings_to_stderr():
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 2
        return subprocess.CompletedProcess(["lockstep", *argv], code, *texts)
    finally:
        sys.path.remove(str(cwd))
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def assert_one_error_line(result: subprocess.CompletedProcess, said: str) -> None:
    """Bad input's contract: exit 2, no traceback, one error line, and it says `said`."""
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert said in lines[0], lines[0]
