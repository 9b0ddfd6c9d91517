"""The per-job key that signs every value preflight writes to a store (`store.Signer`).

Across hosts it comes from the operator and never travels through a store: `LOCKSTEP_JOB_KEY`
(the key itself, at least 32 characters: `openssl rand -hex 32`) or `LOCKSTEP_JOB_KEY_FILE` (a
file holding it that only the job's user can read). Where preflight starts every rank on one
host itself (`--nproc`), it makes one (`local_key`). Without a key the ranks still run, and the
verdict says UNAUTHENTICATED instead of PASS; `--require-key` makes a missing key an error.
The key's text is registered with `lockstep.redact`, so no output carries it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from lockstep.errors import UsageError
from lockstep.redact import add_secret_value

KEY_ENV = "LOCKSTEP_JOB_KEY"
KEY_FILE_ENV = "LOCKSTEP_JOB_KEY_FILE"
MIN_CHARS = 32  # 128 bits as hex
_HOW = (
    f"give every host the same {KEY_ENV} (from `openssl rand -hex 32`) or a {KEY_FILE_ENV} "
    "only the job's user can read"
)


def load(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The job's key from the environment or its file, or None where neither is set. Bad
    input (a short key, an unreadable file, a file group or others can read): UsageError."""
    env = os.environ if environ is None else environ
    text, source = env.get(KEY_ENV, ""), KEY_ENV
    path = env.get(KEY_FILE_ENV, "")
    if text and path:
        raise UsageError(f"preflight: both {KEY_ENV} and {KEY_FILE_ENV} are set; keep one")
    if path:
        text, source = _read_file(Path(path)), f"{KEY_FILE_ENV}={path}"
    text = text.strip()
    if not text:
        return None
    add_secret_value(text)
    if len(text) < MIN_CHARS:
        raise UsageError(
            f"preflight: the job key in {source} has {len(text)} characters; it needs at "
            f"least {MIN_CHARS} (128 bits as hex: `openssl rand -hex 32`)"
        )
    return text.encode()


def require(key: bytes | None, required: bool) -> None:
    """`--require-key` without a key: exit 2 before any rank starts."""
    if key is None and required:
        raise UsageError(f"preflight: no job key is set (--require-key): {_HOW}")


def _read_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"preflight: {KEY_FILE_ENV}={path} is open to group or others "
                f"(mode {stat.S_IMODE(mode):o}); run `chmod 600 {path}` (Kubernetes: "
                "defaultMode: 0400)"
            )
        return path.read_text()
    except OSError as err:
        raise UsageError(
            f"preflight: cannot read {KEY_FILE_ENV}={path}: {err.strerror or err}"
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"preflight: {KEY_FILE_ENV}={path} is not text") from None


@contextlib.contextmanager
def local_key() -> Iterator[None]:
    """While inside: a key in `LOCKSTEP_JOB_KEY` for the ranks preflight starts on this host
    (`--nproc`), made here unless the operator set one; the environment restored after."""
    env = os.environ
    if env.get(KEY_ENV) or env.get(KEY_FILE_ENV):
        yield
        return
    key = secrets.token_hex(32)
    add_secret_value(key)
    env[KEY_ENV] = key
    try:
        yield
    finally:
        env.pop(KEY_ENV, None)
