"""Which names are secret, and how a secret is shown: `<redacted:HMAC>`."""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import os
import re
import secrets

# Words that make a name secret, as whole parts of it (`apiKey`, not `tokenizers`).
_WORDS = frozenset(
    {
        *("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PGPASS"),
        *("PGPASSWORD", "PRIVATE", "CREDENTIAL", "COOKIE", "SESSION", "SIGNATURE", "SIG"),
        *("AUTH", "AUTHORIZATION", "DSN", "APIKEY", "ACCESSKEY", "BEARER", "CONNECTIONSTRING"),
        *("PW", "PSW", "PSWD", "PAT", "JWT", "WEBHOOK"),
    }
)
# Plurals that still name a secret; `tokens` counts tokens.
_PLURALS = _WORDS - {"TOKEN"}
# A KEY that names no secret after these (`env_key`, `ssh_public_key`).
_PLAIN_KEYS = frozenset(
    {"ENV", "CACHE", "SORT", "PRIMARY", "FOREIGN", "PARTITION", "GROUP", "LOOKUP", "DICT"}
    | {"INDEX", "HASH", "PUBLIC", "METRIC", "CONFIG", "ROW", "COLUMN", "FIELD"}
)
# Endings of names that hold no secret (`KeyError`, `KEY_FILE`, `--token-command`).
_NOT_A_VALUE = frozenset(
    {"ERROR", "EXCEPTION", "WARNING", "FILE", "PATH", "DIR", "COMMAND", "CMD", "TYPE", "INFO"}
)
# One word ending in these names a secret too (Docker's `identitytoken`).
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PARTS = re.compile(r"[^A-Z0-9]+")

_PROCESS_KEY = secrets.token_bytes(32)


def _key() -> bytes:
    for name in ("LOCKSTEP_REDACT_SALT", "LOCKSTEP_REDACT_KEY"):
        value = os.environ.get(name)
        if value:
            return value.encode()
    return _PROCESS_KEY


def is_secret_name(name: object) -> bool:
    """Whether a name looks secret."""
    return isinstance(name, str) and _secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    parts = [p for p in _PARTS.split(_CAMEL.sub("_", name).upper()) if p]
    if not parts or parts[-1] in _NOT_A_VALUE:
        return False
    singular = [p[:-1] if p.endswith("S") and p[:-1] in _PLURALS else p for p in parts]
    words = {
        p
        for i, p in enumerate(singular)
        if p != "KEY" or i == 0 or singular[i - 1] not in _PLAIN_KEYS
    }
    joined = {a + b for a, b in itertools.pairwise(singular)}
    glued = any(p.endswith(_SUFFIXES) for p in singular)
    return bool(glued or _WORDS.intersection(words) or _WORDS.intersection(joined))


def fingerprint_of(value: object) -> str:
    """64 bits of HMAC-SHA256 under the job's or the user's key."""
    text = value if isinstance(value, str) else repr(value)
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()[:16]


def redacted(value: object) -> str:
    return f"<redacted:{fingerprint_of(value)}>"
