"""The per-job key that signs every value preflight writes to a store (`store.Signer`).

Across hosts it comes from the operator and never travels through a store: `LOCKSTEP_JOB_KEY`
(the key itself, at least 32 characters: `openssl rand -hex 32`) or `LOCKSTEP_JOB_KEY_FILE` (a
file holding it, owned by the job's user, that no one else can read). Where preflight starts
every rank on one host itself (`--nproc`), it makes one (`local_key`). With neither variable set
the ranks still run, and the verdict says UNAUTHENTICATED instead of PASS; `--require-key` makes
a missing key an error. A variable that is set but blank, or a file with no key in it, is an
error always: it means a key was meant and got lost (an empty Secret, a failed `openssl`), so
it must not pass as an unauthenticated run.
The key's text is registered with `lockstep.redact`, so no output carries it (`redact.text`
also scrubs it by the environment in processes that never load it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping

from lockstep.errors import UsageError
from lockstep.redact import add_secret_value

KEY_ENV = "LOCKSTEP_JOB_KEY"
KEY_FILE_ENV = "LOCKSTEP_JOB_KEY_FILE"
MIN_CHARS = 32  # 128 bits as hex
MAX_FILE_BYTES = 4096  # a key is 64 characters; more is not a key file
_HOW = (
    f"give every host the same {KEY_ENV} (from `openssl rand -hex 32`) or a {KEY_FILE_ENV} "
    "only the job's user can read"
)


def load(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The job's key from the environment or its file, or None where neither is set. Bad
    input (a blank variable, an empty or short key, an unreadable file, a file another user
    owns or group or others can read): UsageError."""
    env = os.environ if environ is None else environ
    if KEY_ENV in env and KEY_FILE_ENV in env:
        raise UsageError(f"preflight: both {KEY_ENV} and {KEY_FILE_ENV} are set; keep one")
    if KEY_FILE_ENV in env:
        path = env[KEY_FILE_ENV]
        if not path.strip():
            raise UsageError(f"preflight: {KEY_FILE_ENV} is set but empty: {_HOW}")
        text, source = _read_file(path).strip(), f"{KEY_FILE_ENV}={path}"
        if not text:
            raise UsageError(
                f"preflight: {source} holds no key (the file is empty or blank): write one "
                f"there (`umask 077 && openssl rand -hex 32 > {path}`)"
            )
    elif KEY_ENV in env:
        text, source = env[KEY_ENV].strip(), KEY_ENV
        if not text:
            raise UsageError(f"preflight: {KEY_ENV} is set but blank: {_HOW}")
    else:
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


def _read_file(path: str) -> str:
    """The key file's text. Opened once, and every check made on what was opened (`fstat` of
    the descriptor), so nothing can swap the file between the check and the read. A symbolic
    link is followed (a Kubernetes Secret's mounted file is one): the file it leads to is the
    one checked. O_NONBLOCK: a FIFO planted there is refused, not waited on."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise UsageError(
            f"preflight: cannot read {KEY_FILE_ENV}={path}: {err.strerror or err}"
        ) from None
    try:
        _check_opened(path, os.fstat(fd))
        data = b""
        while len(data) <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1)):
            data += chunk
    except OSError as err:
        raise UsageError(
            f"preflight: cannot read {KEY_FILE_ENV}={path}: {err.strerror or err}"
        ) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"preflight: {KEY_FILE_ENV}={path} is over {MAX_FILE_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"preflight: {KEY_FILE_ENV}={path} is not text") from None


def _check_opened(path: str, st: os.stat_result) -> None:
    """A regular file that this user owns and no one else can read or write."""
    where = f"preflight: {KEY_FILE_ENV}={path}"
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{where} is not a regular file")
    if st.st_uid != os.geteuid():
        raise UsageError(
            f"{where} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): "
            "another user could have written the key; keep the job's own copy"
        )
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(
            f"{where} is open to group or others (mode {stat.S_IMODE(st.st_mode):o}); run "
            f"`chmod 600 {path}` (Kubernetes: defaultMode: 0400)"
        )


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
