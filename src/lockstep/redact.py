"""Keep secrets out of every output: names that look secret, credentials inside URLs.

A redacted value keeps a short salted hash, so two ranks with different secrets still compare
as different without either value ever being shown. The salt is per process unless
LOCKSTEP_REDACT_SALT is set (preflight sets one salt for the whole job so hashes compare).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Mapping

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^/@\s:]*:[^/@\s]*|[^/@\s:]+)@"
)

_PROCESS_SALT = secrets.token_hex(8)


def _salt() -> str:
    return os.environ.get("LOCKSTEP_REDACT_SALT") or _PROCESS_SALT


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def fingerprint_of(value: str) -> str:
    """A short salted hash: equal values give equal text, the value cannot be read back."""
    return hashlib.sha256((_salt() + "\0" + value).encode()).hexdigest()[:12]


def redacted(value: str) -> str:
    return f"<redacted:{fingerprint_of(value)}>"


def scrub_text(text: str) -> str:
    """Replace credentials inside URLs (`scheme://user:pass@host`) in free text."""
    return URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{redacted(m['cred'])}@", text)


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name):
        return redacted(value)
    return scrub_text(value)


def redact_mapping(mapping: Mapping[str, object]) -> dict[str, object]:
    """Redact a flat or nested mapping of names to values (dicts and lists are walked)."""
    out: dict[str, object] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        elif isinstance(value, list):
            out[key] = [
                redact_mapping(v) if isinstance(v, Mapping) else _leaf(key, v) for v in value
            ]
        else:
            out[key] = _leaf(key, value)
    return out


def _leaf(name: str, value: object) -> object:
    if isinstance(value, str):
        return redact_value(name, value)
    if value is not None and is_secret_name(name) and not isinstance(value, bool | int | float):
        return redacted(str(value))
    return value
