"""Keep secrets out of every output: secret-looking names, and secrets inside free text.

A redacted value is shown as `<redacted:HMAC>`, 64 bits of HMAC-SHA256 under a key that no
output contains, so even a 4-digit secret cannot be recovered by hashing guesses, while two
ranks whose values of the same secret differ still show as a mismatch. The key is, in order:
`LOCKSTEP_REDACT_SALT` (one random key per preflight job, shared by its ranks through the
rendezvous store); `LOCKSTEP_REDACT_KEY` (yours: set the same value when making fingerprint files
with `lockstep fingerprint` that `lockstep diff` should compare); else a random key per process.

Names: KEY, TOKEN, SECRET, PASSWORD/PASSWD/PASSPHRASE, PGPASS and *_PASS, PRIVATE, CREDENTIAL,
COOKIE, SESSION, SIGNATURE, AUTH, *_CONNECTION_STRING (any case). Under a secret-named key the
whole value goes, nested or not, whatever its type. Free text: credentials in URLs (passwords
holding `@`, `/` or spaces too), `NAME=value`, `--name=value`, `--name value`, `NAME: value`,
`"name": "value"` (JSON), Authorization headers and bearer tokens, secret query parameters of
signed URLs, PEM private keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

# Words that make a name secret, matched as whole parts of it: `HF_TOKEN`, `apiKey`, `db-pass`,
# `X-Amz-Signature`, `credentials`; but not `tokenizers` or `keyring` (package names).
_WORDS = frozenset(
    {
        *("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PGPASS"),
        *("PGPASSWORD", "PRIVATE", "CREDENTIAL", "COOKIE", "SESSION", "SIGNATURE", "SIG"),
        *("AUTH", "AUTHORIZATION", "DSN", "APIKEY", "ACCESSKEY", "BEARER", "CONNECTIONSTRING"),
    }
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PARTS = re.compile(r"[^A-Z0-9]+")

_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?"
    r"(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
# scheme://user:password@host: the password may hold '@', '/', ':' or spaces, so it runs to the
# last '@' on the line that is followed by a host name.
URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/@:]*:[^\n]*@|[^\s/@:]+@)"
    r"(?=[A-Za-z0-9\[][\w.\-\]:]*(?:[/?#:\s\"',;)]|$))"
)
_NOT_DONE = r"(?!<redacted:)"
_AUTH_HEADER = re.compile(
    rf"(?P<k>\b(?P<name>(?:proxy-)?authorization)\b[\"']?\s*[:=]\s*[\"']?){_NOT_DONE}"
    r"(?P<v>[^\n\"']+)",
    re.IGNORECASE,
)
_BEARER = re.compile(
    rf"(?P<k>\b(?P<name>bearer|basic)\s+){_NOT_DONE}(?P<v>[A-Za-z0-9._~+/=:-]{{6,}})",
    re.IGNORECASE,
)
_JSON_PAIR = re.compile(
    rf"(?P<k>[\"'](?P<name>[^\"'\n]{{1,80}})[\"']\s*:\s*){_NOT_DONE}"
    # a nested object or list is left to its own keys' patterns
    r"(?P<v>\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^,{}\[\]\s]+)"
)
_QUERY = re.compile(rf"(?P<k>[?&;](?P<name>[\w.-]+)=){_NOT_DONE}(?P<v>[^&#\s\"']+)")
_ASSIGN = re.compile(
    rf"(?P<k>(?<![\w.-])-{{0,2}}(?P<name>[A-Za-z_][\w.-]*)\s*[=:]\s*){_NOT_DONE}"
    r"(?P<v>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)"
)
_FLAG = re.compile(
    rf"(?P<k>(?<![\w-])--(?P<name>[A-Za-z][\w-]*)\s+){_NOT_DONE}(?P<v>[^\s\"'-][^\s\"']*)"
)

_PROCESS_KEY = secrets.token_bytes(32)


def new_key() -> str:
    """A fresh random key (what one preflight job shares among its ranks)."""
    return secrets.token_hex(32)


def _key() -> bytes:
    for name in ("LOCKSTEP_REDACT_SALT", "LOCKSTEP_REDACT_KEY"):
        value = os.environ.get(name)
        if value:
            return value.encode()
    return _PROCESS_KEY


def is_secret_name(name: object) -> bool:
    """Whether a name (of a variable, key, flag or query parameter) looks secret."""
    if not isinstance(name, str):
        return False
    parts = [p for p in _PARTS.split(_CAMEL.sub("_", name).upper()) if p]
    singular = [p[:-1] if p.endswith("S") and p[:-1] in _WORDS else p for p in parts]
    joined = {a + b for a, b in itertools.pairwise(singular)}
    return bool(_WORDS.intersection(singular) or _WORDS.intersection(joined))


def fingerprint_of(value: object) -> str:
    """64 bits of HMAC-SHA256 under the job's or the user's key: equal values give equal text."""
    text = value if isinstance(value, str) else repr(value)
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()[:16]


def redacted(value: object) -> str:
    return f"<redacted:{fingerprint_of(value)}>"


def _sub(pattern: re.Pattern, text: str) -> str:
    def one(m: re.Match) -> str:
        value = m["v"]
        if not is_secret_name(m["name"]):
            return m.group(0)
        quote = value[0] if value[:1] in "\"'" and value[-1:] == value[:1] else ""
        inner = value[1:-1] if quote else value
        return f"{m['k']}{quote}{redacted(inner)}{quote}"

    return pattern.sub(one, text)


def scrub_text(text: str) -> str:
    """Replace every secret that free text may carry (see the module docstring)."""
    if not isinstance(text, str):
        text = str(text)
    text = _PEM.sub(lambda m: redacted(m.group(0)), text)
    text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{redacted(m['cred'][:-1])}@", text)
    for pattern in (_AUTH_HEADER, _BEARER, _JSON_PAIR, _QUERY, _ASSIGN, _FLAG):
        text = _sub(pattern, text)
    return text


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its secrets redacted: each argument's own (`--set api_token=x`,
    `--set logging.run_name=https://u:p@h`), and the whole argument after a secret-named flag
    (`--api-key VALUE`)."""
    out = []
    for i, arg in enumerate(argv):
        flag = argv[i - 1] if i else ""
        after_secret_flag = flag.startswith("-") and "=" not in flag
        out.append(redacted(arg) if after_secret_flag and is_secret_name(flag) else scrub_text(arg))
    return out


@contextlib.contextmanager
def scrubbed_argv() -> Iterator[None]:
    """`sys.argv` redacted while inside, for a library that records the command line (wandb)."""
    argv = sys.argv
    sys.argv = scrub_argv(argv)
    try:
        yield
    finally:
        sys.argv = argv


def scrub_file(path: str | os.PathLike) -> bool:
    """Rewrite a text file (a child process's log) with its secrets redacted; whether it had any."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", "replace")
    clean = scrub_text(text)
    if clean != text:
        path.write_text(clean, encoding="utf-8")
    return clean != text


@contextlib.contextmanager
def scrubbed_log(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A new file at `path`, open for appending, for children's stdout/stderr (every writer
    appends, so a process that opens it again writes after, not over, the others); when the
    block ends, however it ends (a timeout's kill too), it is scrubbed before anything reads or
    quotes it."""
    try:
        open(path, "wb").close()
        with open(path, "ab") as out:
            yield out
    finally:
        if os.path.isfile(path):
            scrub_file(path)


def redact_value(name: object, value: object) -> object:
    """One value under its name: all of it when the name looks secret, else its secrets."""
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
    """Redact a flat or nested mapping; lists and tuples are walked, secret-named subtrees go."""
    return {key: redact_value(key, value) for key, value in mapping.items()}


def _canonical(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=repr, separators=(",", ":"))
