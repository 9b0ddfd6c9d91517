"""Secrets out of command lines, child processes' logs, logging records and mappings."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from lockstep.redact.names import is_secret_name, redacted
from lockstep.redact.stream import scrubbing_fifo
from lockstep.redact.text import SHORT_FLAG_PLAIN, scrub_text


def _secret_flag(flag: str, value: str) -> bool:
    if not flag.startswith("-") or "=" in flag:
        return False
    if flag == "-p":
        return not SHORT_FLAG_PLAIN.match(value)
    return is_secret_name(flag)


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its secrets redacted, whole arguments after a secret-named flag."""
    out = []
    for i, arg in enumerate(argv):
        flag = argv[i - 1] if i else ""
        out.append(redacted(arg) if _secret_flag(flag, arg) else scrub_text(arg))
    return out


@contextlib.contextmanager
def scrubbed_argv() -> Iterator[None]:
    """`sys.argv` redacted while inside (for wandb, which records it)."""
    argv = sys.argv
    sys.argv = scrub_argv(argv)
    try:
        yield
    finally:
        sys.argv = argv


def scrub_file(path: str | os.PathLike) -> bool:
    """Rewrite a text file with its secrets redacted; whether it had any."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", "replace")
    clean = scrub_text(text)
    if clean != text:
        path.write_text(clean, encoding="utf-8")
    return clean != text


@contextlib.contextmanager
def scrubbed_log(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Children's output into the new file `path`, scrubbed as written."""
    if _is_fifo(path):
        with open(path, "wb") as out:
            yield out
        return
    with scrubbing_fifo(path) as fifo, open(fifo, "wb") as out:
        yield out


def _is_fifo(path: str | os.PathLike) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


class _ScrubRecords(logging.Filter):
    """Rewrites a record as its redacted text, traceback included."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        elif record.exc_text:
            text += "\n" + record.exc_text
        record.msg, record.args = scrub_text(text), ()
        record.exc_info = record.exc_text = None
        return True


@contextlib.contextmanager
def scrubbed_logger(logger: str = "torch.distributed.elastic") -> Iterator[None]:
    """While inside, every handler that `logger`'s records reach redacts them."""
    handlers, log = {logging.lastResort} - {None}, logging.getLogger(logger)
    for name, child in list(logging.root.manager.loggerDict.items()):
        if name.startswith(logger + ".") and isinstance(child, logging.Logger):
            handlers.update(child.handlers)
    while log:
        handlers.update(log.handlers)
        log = log.parent if log.propagate else None
    scrub = _ScrubRecords()
    for handler in handlers:
        handler.addFilter(scrub)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(scrub)


def redact_value(name: object, value: object) -> object:
    """One value under its name: all of it when the name looks secret."""
    if value is None or isinstance(value, bool):
        return value
    if is_secret_name(name):
        return redacted(value if isinstance(value, str) else _canonical(value))
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_value(name, v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


def redact_mapping(mapping: Mapping) -> dict:
    """Redact a flat or nested mapping."""
    return {key: redact_value(key, value) for key, value in mapping.items()}


def _canonical(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=repr, separators=(",", ":"))
