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
import functools
import hashlib
import hmac
import itertools
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

# Words that make a name secret, matched as whole parts of it: `HF_TOKEN`, `apiKey`, `db-pass`,
# `X-Amz-Signature`, `credentials`, `GH_PAT`, `CI_JOB_JWT`; but not `tokenizers` or `keyring`
# (package names).
_WORDS = frozenset(
    {
        *("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PGPASS"),
        *("PGPASSWORD", "PRIVATE", "CREDENTIAL", "COOKIE", "SESSION", "SIGNATURE", "SIG"),
        *("AUTH", "AUTHORIZATION", "DSN", "APIKEY", "ACCESSKEY", "BEARER", "CONNECTIONSTRING"),
        *("PW", "PSW", "PSWD", "PAT", "JWT", "WEBHOOK"),
    }
)
# Plurals that still name a secret (`credentials`, `api_keys`); `tokens` counts tokens.
_PLURALS = _WORDS - {"TOKEN"}
# A KEY that names no secret after these (`env_key`, `sort_key`, `ssh_public_key`).
_PLAIN_KEYS = frozenset(
    {"ENV", "CACHE", "SORT", "PRIMARY", "FOREIGN", "PARTITION", "GROUP", "LOOKUP", "DICT"}
    | {"INDEX", "HASH", "PUBLIC", "METRIC", "CONFIG", "ROW", "COLUMN", "FIELD"}
)
# A name ending in these is an exception's or a warning's (`KeyError`, `TokenExpiredError`).
_NOT_A_VALUE = frozenset({"ERROR", "EXCEPTION", "WARNING"})
# Upper-case verdicts that open a line of lockstep's own (`PASS: ...`): `PASS` is no password there.
_VERDICTS = frozenset({"PASS"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PARTS = re.compile(r"[^A-Z0-9]+")

_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?"
    r"(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
# scheme://user:password@host: the password may hold '@', '/', ':' or spaces, so it runs to the
# last '@' on the line that is followed by a host name (not by an image digest, `@sha256:`).
# Matched by `_url_line` in one pass over each line: the scheme, the user, then that '@'.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
_USER = re.compile(r"[^\s/@:]*")
_AT_HOST = re.compile(r"@(?!sha(?:256|384|512):)(?=[A-Za-z0-9\[][\w.\-\]:]*(?:[/?#:\s\"',;)]|$))")
# Tokens whose shape alone says what they are, wherever they stand.
_TOKEN_SHAPES = re.compile(
    r"(?<![\w-])(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_(?=[A-Za-z]*\d)[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-(?=[A-Za-z_-]*\d)[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"  # AWS access key ids
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|AIza[0-9A-Za-z_-]{35}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT
    r")"
)
_WEBHOOK = re.compile(
    r"\bhttps?://(?:hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/"
    r"|(?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks/)(?P<v>[\w/-]+)"
)
# YAML's block scalars under a secret name: `secret: |` and the lines indented below it.
_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)(?:-[ \t]+)?(?P<q>[\"']?)(?P<name>[\w.-]+)(?P=q)[ \t]*:[ \t]*"
    r"[|>][-+0-9]*[ \t]*(?:#[^\n]*)?$",
    re.MULTILINE,
)

# Each form below is a pattern for a name and what separates it from its value (group `name`,
# and `q` for a quoted name), and a pattern for the value, matched only after a secret name:
# a name that is not secret is stepped over and the search goes on inside its value
# (`--set a=1,password=x`, `Config(api_key='x')`, `...;AccountKey=...`). One pass over the text
# per form, so the scrub stays linear in its length.
_DQ = r"\"(?:[^\"\\\n]|\\.)*\""
_SQ = r"'(?:[^'\\\n]|\\.)*'"
# A quoted value inside a string's repr or in JSON, its quotes escaped: \'x\', \"x\"; and in
# a shell-quoted argument, '"'"'x'"'"' (`shlex.quote` of `api_key='x'`).
_ESCAPED = (
    r"\\\"(?:[^\"\\\n]|\\[^\"\n])*\\\"|\\'(?:[^'\\\n]|\\[^'\n])*\\'"
    r"|'\"'\"'(?:(?!'\"'\"')[^\n])*'\"'\"'"
)
_SHELL_QUOTE = "'\"'\"'"
_QUOTED = rf"{_ESCAPED}|{_DQ}|{_SQ}"
_NULLS = frozenset({"null", "None", "true", "false", "True", "False", "~"})
_SHORT_FLAG_PLAIN = re.compile(r"[/.~$-]|no:|\d+:\d+")  # a path, pytest's -p no:x, a port map


class _Form:
    def __init__(self, key: str, value: str, kind: str = "", flags: int = 0):
        self.key = re.compile(key, flags)
        self.value = re.compile(value)
        self.kind = kind


_FORMS = (
    _Form(  # Authorization: Basic ..., proxy-authorization=...
        r"\b(?P<name>(?:proxy-)?authorization)\b[\"']?\s*[:=]\s*[\"']?",
        r"[^\n\"']+",
        flags=re.IGNORECASE,
    ),
    _Form(r"\b(?P<name>bearer|basic)\s+", r"[A-Za-z0-9._~+/=:-]{6,}", flags=re.IGNORECASE),
    _Form(  # "name": "value", 'name': 'value' (JSON, Python reprs)
        r"(?P<q>[\"'])(?P<name>[^\"'\n]{1,80})(?P=q)\s*:\s*",
        rf"{_QUOTED}|[^,{{}}\[\]\s]+",
        "json",
    ),
    _Form(  # os.environ["HF_TOKEN"] = "..."
        r"\[\s*(?P<q>[\"'])(?P<name>[^\"'\n]{1,80})(?P=q)\s*\]\s*=(?!=)\s*",
        rf"{_QUOTED}|[^\s,;)\]]+",
    ),
    _Form(  # ['--token', 'x'] (an argv's repr, escaped in a repr too), setdefault("TOKEN", "x")
        r"\\?(?P<q>[\"'])(?P<name>-{0,2}[A-Za-z_][\w.-]{0,79})\\?(?P=q)\s*,\s*",
        rf"(?:{_QUOTED})(?!\s*:)",  # not the next key of a JSON object: `"field": "X_TOKEN", "value": ...`
        "pair",
    ),
    _Form(r"[?&;](?P<name>[\w.-]+)=", r"[^&#\s\"']+"),  # signed URLs' query parameters
    _Form(  # NAME=value, --name=value
        r"(?<![\w.-])-{0,2}(?P<name>[A-Za-z_][\w.-]*)\s*=(?!=)\s*",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\]+",
    ),
    _Form(  # NAME: value (YAML: to the end of the line, or of the JSON string it is in)
        r"(?<![\w.-])-{0,2}(?P<name>[A-Za-z_][\w.-]*)[ \t]*:[ \t]+",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|(?:[^\n\"\\]|\\[^\"\n])+",
        "yaml",
    ),
    _Form(  # --name value, --name "a b"
        r"(?<![\w-])--(?P<name>[A-Za-z][\w-]*)\s+",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\-][^\s\"'\\]*",
    ),
    _Form(  # -p value (mysql, docker login, sshpass)
        r"(?<![\w-])-(?P<name>p)(?:[ \t]+|=)",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\][^\s\"'\\]*",
        "short",
    ),
    _Form(  # wandb's "Invalid API key <key>", "API key is <key>"
        r"(?i)\b(?P<name>api[ -]key)(?:[ \t]+is)?[ \t]*:?[ \t]+",
        r"(?=[A-Za-z_-]*\d)[\w-]{8,}",
    ),
)

_PROCESS_KEY = secrets.token_bytes(32)


def _key() -> bytes:
    for name in ("LOCKSTEP_REDACT_SALT", "LOCKSTEP_REDACT_KEY"):
        value = os.environ.get(name)
        if value:
            return value.encode()
    return _PROCESS_KEY


def is_secret_name(name: object) -> bool:
    """Whether a name (of a variable, key, flag or query parameter) looks secret."""
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
    return bool(_WORDS.intersection(words) or _WORDS.intersection(joined))


def fingerprint_of(value: object) -> str:
    """64 bits of HMAC-SHA256 under the job's or the user's key: equal values give equal text."""
    text = value if isinstance(value, str) else repr(value)
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()[:16]


def redacted(value: object) -> str:
    return f"<redacted:{fingerprint_of(value)}>"


def _replacement(form: _Form, m: re.Match, value: str) -> str | None:
    """What a secret value after `m` becomes, or None to leave it."""
    if form.kind == "yaml":
        if m["name"] in _VERDICTS:
            return None  # a verdict line (`PASS: 2 ranks on 1 node`), not a password
        value = value.rstrip()
        if value in _NULLS or (value[:1] in "|>" and not value.strip("|>-+0123456789")):
            return None  # nothing to hide; a block scalar is `_blocks`'
    elif form.kind == "json" and value in _NULLS:
        return None  # `"api_key": null` stays valid JSON
    elif form.kind == "short" and _SHORT_FLAG_PLAIN.match(value):
        return None
    quote = value[0] if len(value) > 1 and value[0] in "\"'" and value[-1] == value[0] else ""
    if value[:1] == "\\" and len(value) > 3 and value[:2] == value[-2:]:
        quote = value[:2]  # \'x\' in a repr, \"x\" in JSON
    elif value.startswith(_SHELL_QUOTE) and len(value) > 10 and value.endswith(_SHELL_QUOTE):
        quote = _SHELL_QUOTE
    inner = value[len(quote) : len(value) - len(quote)]
    if not inner or inner.startswith("<redacted:"):
        return None
    if form.kind == "json" and not quote:
        quote = m["q"]  # a bare number under a quoted name: still valid JSON once quoted
    return f"{quote}{redacted(inner)}{quote}"


def _sub(form: _Form, text: str) -> str:
    out, done, pos = [], 0, 0
    while (m := form.key.search(text, pos)) is not None:
        pos = max(m.end(), m.start() + 1)
        if form.kind != "short" and not is_secret_name(m["name"]):
            continue  # look for secrets inside its value
        v = form.value.match(text, m.end())
        if v is None or not v.group():
            continue
        value = v.group()
        new = _replacement(form, m, value)
        if new is None:
            continue
        end = m.end() + len(value.rstrip()) if form.kind == "yaml" else v.end()
        out += [text[done : m.end()], new]
        done = pos = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _url_line(line: str) -> str:
    """A line's URL credentials redacted, in one pass (see `_SCHEME`)."""
    ats = [m.start() for m in _AT_HOST.finditer(line)]
    if not ats:
        return line
    last, hosts = ats[-1], set(ats)
    out, done, pos = [], 0, 0
    while (m := _SCHEME.search(line, pos)) is not None and m.end() < last:
        start = m.end()
        user = _USER.match(line, start).end()
        if user < len(line) and line[user] == ":" and last > user:
            at = last  # user:password@, the password running to the last '@' before a host
        elif user > start and user in hosts:
            at = user  # token@
        else:
            pos = start
            continue
        out += [line[done:start], redacted(line[start:at])]
        done = pos = at
    out.append(line[done:])
    return "".join(out)


def _blocks(text: str) -> str:
    """YAML block scalars under secret names: the indented lines below `secret: |` go."""
    out, done, pos = [], 0, 0
    while (m := _BLOCK.search(text, pos)) is not None:
        pos = m.end() + 1
        if not is_secret_name(m["name"]):
            continue
        depth, end, body = len(m["indent"]), m.end(), []
        while end < len(text):  # the block: the lines indented deeper (blank ones within)
            stop = text.find("\n", end + 1)
            line = text[end + 1 : len(text) if stop < 0 else stop]
            if line.strip() and len(line) - len(line.lstrip(" \t")) <= depth:
                break
            body.append(line)
            end = len(text) if stop < 0 else stop
        while body and not body[-1].strip():
            end -= len(body.pop()) + 1
        if not body:
            continue
        indent = min(len(b) - len(b.lstrip(" \t")) for b in body if b.strip())
        value = "\n".join(b[indent:] for b in body)
        out += [text[done : m.end()], "\n", body[0][:indent] or " " * (depth + 2), redacted(value)]
        done = pos = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def scrub_text(text: str) -> str:
    """Replace every secret that free text may carry (see the module docstring), in time linear
    in its length."""
    if not isinstance(text, str):
        text = str(text)
    text = _PEM.sub(lambda m: redacted(m.group(0)), text)
    if ":" in text:
        text = _blocks(text)
    if "://" in text and "@" in text:
        text = "\n".join(
            _url_line(line) if "://" in line and "@" in line else line for line in text.split("\n")
        )
    text = _WEBHOOK.sub(lambda m: m.group(0)[: m.start("v") - m.start()] + redacted(m["v"]), text)
    text = _TOKEN_SHAPES.sub(lambda m: redacted(m.group(0)), text)
    for form in _FORMS:
        text = _sub(form, text)
    return text


def _secret_flag(flag: str, value: str) -> bool:
    if not flag.startswith("-") or "=" in flag:
        return False
    if flag == "-p":
        return not _SHORT_FLAG_PLAIN.match(value)
    return is_secret_name(flag)


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its secrets redacted: each argument's own (`--set api_token=x`,
    `--set logging.run_name=https://u:p@h`, `--set a=1,password=x`), and the whole argument
    after a secret-named flag (`--api-key VALUE`, `-p VALUE`)."""
    out = []
    for i, arg in enumerate(argv):
        flag = argv[i - 1] if i else ""
        out.append(redacted(arg) if _secret_flag(flag, arg) else scrub_text(arg))
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


class _ScrubRecords(logging.Filter):
    """Rewrites a record as its redacted text (message and traceback): torchelastic logs a
    failed rank's exception, whose text may hold a secret, through its own logger."""

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
    """While inside: every handler that records of `logger` and its children reach redacts
    them first (a handler's filter, unlike a logger's, sees its children's records too)."""
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
