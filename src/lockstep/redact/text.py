"""Secrets inside free text, each form found in one pass (linear in the text's length).
Design: docs/design/redaction.md."""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat

from lockstep.redact.forms import pem_bodies, user_passwords, wandb_logins
from lockstep.redact.names import is_secret_name, redacted

# lockstep's verdict lines (`PASS: ...`): no password.
_VERDICTS = frozenset({"PASS"})
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?"
    r"(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
# user:password@host: the password runs to the line's last '@' before a host.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
_USER = re.compile(r"[^\s/@:]*")
_AT_HOST = re.compile(r"@(?!sha(?:256|384|512):)(?=[A-Za-z0-9\[][\w.\-\]:]*(?:[/?#:\s\"',;)]|$))")
# Tokens known by their shape.
_TOKEN_SHAPES = re.compile(
    r"(?:(?<![\w-])|(?<=/bot))(?:"  # (Telegram's API URL)
    r"gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_(?=[A-Za-z]*\d)[A-Za-z0-9]{20,}|(?:hf|api_org)_[A-Za-z0-9]{34}(?!\w)"  # Hugging Face
    r"|\d{5,16}:A[\w-]{32,36}(?![\w-])"  # Telegram bots
    r"|[MNO](?=[A-Za-z_-]*\d)[\w-]{23,25}\.[\w-]{6}\.[\w-]{27,38}(?![\w-])"  # Discord bots
    # AWS session tokens: base64 naming `origin_ec` or `er/aws` early on
    r"|(?<![+/=])[A-Za-z0-9+/]{4}(?:b3JpZ2luX2Vj|ZXIvYXdz)[A-Za-z0-9+/]{80,}={0,2}"
    r"|sk-(?=[A-Za-z_-]*\d)[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"  # AWS key ids
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|AIza[0-9A-Za-z_-]{35}"
    r"|ya29\.[0-9A-Za-z_-]{20,}"  # Google OAuth
    r"|dapi[0-9a-f]{32}(?:-\d+)?"  # Databricks
    r"|SG\.[\w-]{16,}\.[\w-]{16,}"  # SendGrid
    r"|SK[0-9a-fA-F]{32}(?![0-9A-Za-z])"  # Twilio
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT
    r")"
)
_WEBHOOK = re.compile(
    r"\bhttps?://(?:hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/"
    r"|(?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks/)(?P<v>[\w/-]+)"
)
# YAML's block scalar header: `secret: |`.
_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)(?:-[ \t]+)?(?P<q>[\"']?)(?P<name>[\w.-]+)(?P=q)[ \t]*:[ \t]*"
    r"[|>][-+0-9]*[ \t]*(?:#[^\n]*)?$",
    re.MULTILINE,
)

# A form: a name and its separator (groups `name`, `q`), then a value matched after a secret
# name only; past any other name the search goes on inside its value.
_DQ = r"\"(?:[^\"\\\n]|\\.)*\""
_SQ = r"'(?:[^'\\\n]|\\.)*'"
# Quotes escaped in a repr or JSON (\'x\', \"x\"), or shell-quoted ('"'"'x'"'"').
_ESCAPED = (
    r"\\\"(?:[^\"\\\n]|\\[^\"\n])*\\\"|\\'(?:[^'\\\n]|\\[^'\n])*\\'"
    r"|'\"'\"'(?:(?!'\"'\"')[^\n])*'\"'\"'"
)
_SHELL_QUOTE = "'\"'\"'"
_QUOTED = rf"{_ESCAPED}|{_DQ}|{_SQ}"
_NULLS = frozenset({"null", "None", "true", "false", "True", "False", "~"})
SHORT_FLAG_PLAIN = re.compile(r"[/.~$-]|no:|\d+:\d+")  # a path, pytest's -p no:x, a port map


# .netrc lines
_NETRC = re.compile(
    r"(?m)\bmachine[ \t]+\S+[ \t]+(?:login[ \t]+\S+[ \t]+)?(?:account[ \t]+\S+[ \t]+)?"
    r"password[ \t]+(?P<v>[^\s<]\S*)"
    r"|^[ \t]*(?:login[ \t]+\S+[ \t]+)?password[ \t]+(?P<w>[^\s<]\S*)[ \t]*$"
)
# `mysql -pX`: after a MySQL client on its line only (`-pthread` is gcc's).
_MYSQL = re.compile(r"\b(?:mysql|mariadb)\w*")
_GLUED_P = re.compile(r"(?<=[ \t])-p(?P<v>[^\s\"'<][^\s\"']*)")
# A bare base64 word; HTTP Basic's `user:secret`.
_BASE64 = re.compile(
    r"(?<![\w+/=-])(?:[A-Za-z0-9+/]{4}){3,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?(?![\w+/=-])"
)
_BASIC = re.compile(r"[\w.@+-]{1,64}:[\x21-\x7e]{1,200}")


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
    _Form(  # a bearer token: a digit in it, or long
        r"\b(?P<name>bearer|basic)\s+",
        r"(?=[A-Za-z._~+/=:-]*\d)[A-Za-z0-9._~+/=:-]{6,}|[A-Za-z0-9._~+/=:-]{16,}",
        flags=re.IGNORECASE,
    ),
    _Form(  # "name": "value", 'name': 'value' (JSON, Python reprs)
        r"(?P<q>[\"'])(?P<name>[^\"'\n]{1,80})(?P=q)\s*:\s*",
        rf"{_QUOTED}|[^,{{}}\[\]\s]+",
        "json",
    ),
    _Form(  # os.environ["HF_TOKEN"] = "..."
        r"\[\s*(?P<q>[\"'])(?P<name>[^\"'\n]{1,80})(?P=q)\s*\]\s*=(?!=)\s*",
        rf"{_QUOTED}|[^\s,;)\]]+",
    ),
    _Form(  # ['--token', 'x'] (an argv's repr), setdefault("TOKEN", "x")
        r"\\?(?P<q>[\"'])(?P<name>-{0,2}[A-Za-z_][\w.-]{0,79})\\?(?P=q)\s*,\s*",
        rf"(?:{_QUOTED})(?!\s*:)",  # not the next key of a JSON object
        "pair",
    ),
    _Form(r"[?&;](?P<name>[\w.-]+)=", r"[^&#\s\"']+"),  # signed URLs' query parameters
    _Form(  # NAME=value, --name=value
        r"(?<![\w.-])-{0,2}(?P<name>[A-Za-z_][\w.-]*)\s*=(?!=)\s*",
        rf"{_ESCAPED}|[rRbBuU]{{0,2}}\"[^\"\n]*\"|[rRbBuU]{{0,2}}'[^'\n]*'|[^\s\"'\\`]+",
    ),
    _Form(  # NAME: value (YAML), to the line's end
        r"(?<![\w.-])-{0,2}(?P<name>[A-Za-z_][\w.-]*)[ \t]*:[ \t]+",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|(?:[^\n\"\\`]|\\[^\"\n])+",
        "yaml",
    ),
    _Form(  # --name value, --name "a b"
        r"(?<![\w-])--(?P<name>[A-Za-z][\w-]*)\s+",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\`-][^\s\"'\\`]*",
    ),
    _Form(  # -p value (mysql, docker login, sshpass)
        r"(?<![\w-])-(?P<name>p)(?:[ \t]+|=)",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\`][^\s\"'\\`]*",
        "short",
    ),
    _Form(  # NAME:value, no space; not `host:port` or `scheme://`
        r"(?<![\w.:/-])(?P<name>[A-Za-z_][\w.-]*):(?![\s:/])",
        rf"{_ESCAPED}|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;\\`]+",
        "colon",
    ),
    _Form(  # NAME<TAB>value
        r"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)\t+",
        r"[^\s]+",
    ),
    _Form(  # name%3Dvalue, URL-encoded
        r"(?:(?<![\w.%-])|(?<=%[0-9A-Fa-f]{2}))(?P<name>[A-Za-z_][\w.-]*)%3[dD]",
        r"(?:[^&\s\"'%]|%(?!26)[0-9A-Fa-f]{2})+",
    ),
    _Form(  # wandb's "API key is <key>"
        r"(?i)\b(?P<name>api[ -]key)(?:[ \t]+is)?[ \t]*:?[ \t]+",
        r"(?=[A-Za-z_-]*\d)[\w-]{8,}",
    ),
)

# A documented form's placeholder (`KEY=VALUE`, `api_token=...`).
_PLACEHOLDERS = frozenset({"value", "VALUE", "val", "VAL", "...", "\u2026", "<value>", "X", "x"})
_FIRST_WORD = re.compile(r"[\w.-]*")
# A name that is no English word (`DB_PASS`, `apiKey`).
_IDENTIFIER = re.compile(r".+[_.-].+|[A-Z0-9]{2,}|[a-z]+[A-Z]\w*")
# Code, not a value: `key = f"{x}"`, `key = make(x)`.
_CODE = re.compile(r"(?:[fF][rR]?|[rR][fF])(?=[\"'])|[A-Za-z_][\w.]*\(")


def _placeholder(value: str) -> bool:
    """A placeholder, perhaps followed by punctuation."""
    return value in _PLACEHOLDERS or (value[-1] in ",.;:)" and value[:-1] in _PLACEHOLDERS)


def _reference(word: str) -> bool:
    """A secret's name used as a value (`secrets.DB_PASSWORD`)."""
    return (
        is_secret_name(word)
        and not any(c.isdigit() for c in word)
        and ("_" in word or "." in word or word.isupper())
    )


def _structural(text: str, start: int) -> bool:
    """Whether a name at `start` stands where a YAML key or a log's field does."""
    i = start
    while i > 0 and text[i - 1] in " \t":
        i -= 1
    if i == 0 or text[i - 1] in "\n{,;([:\"'#":
        return True
    return text[i - 1] == "-" and (i == 1 or text[i - 2] in " \t\n")


def _replacement(form: _Form, m: re.Match, value: str) -> str | None:
    """What a secret value after `m` becomes, or None to leave it."""
    if not form.kind and _CODE.match(m.string, m.end()):
        return None  # source code (a traceback's line)
    if form.kind == "yaml" and not (
        _structural(m.string, m.start()) or _IDENTIFIER.fullmatch(m["name"])
    ):
        return None
    if value.lstrip("\"'").startswith("$"):
        return None  # `$DB_PASS`, `${{ secrets.X }}`: a reference
    if form.kind in ("yaml", "colon") and _reference(_FIRST_WORD.match(value).group()):
        return None  # `token: HF_TOKEN` names where the secret is
    if form.kind == "colon" and value.isdigit() and "." in m["name"] + value:
        return None  # host.name:port
    if form.kind == "yaml":
        if m["name"] in _VERDICTS:
            return None
        value = value.rstrip()
        if value in _NULLS or (value[:1] in "|>" and not value.strip("|>-+0123456789")):
            return None  # nothing to hide; a block scalar is `_blocks`'
    elif form.kind == "json" and value in _NULLS:
        return None  # `"api_key": null` stays valid JSON
    elif form.kind == "short" and SHORT_FLAG_PLAIN.match(value.lstrip("\"'")):
        return None  # mkdir -p "$DIR"
    quote = value[0] if len(value) > 1 and value[0] in "\"'" and value[-1] == value[0] else ""
    if value[:1] == "\\" and len(value) > 3 and value[:2] == value[-2:]:
        quote = value[:2]  # \'x\' in a repr, \"x\" in JSON
    elif value.startswith(_SHELL_QUOTE) and len(value) > 10 and value.endswith(_SHELL_QUOTE):
        quote = _SHELL_QUOTE
    inner = value[len(quote) : len(value) - len(quote)]
    if len(inner) < 2 or inner.startswith("<redacted:") or _placeholder(inner):
        return None
    if form.kind == "json" and not quote:
        quote = m["q"]  # a bare number under a quoted name: valid JSON once quoted
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
    """A line's URL credentials redacted."""
    ats = [m.start() for m in _AT_HOST.finditer(line)]
    if not ats:
        return line
    last, hosts = ats[-1], set(ats)
    out, done, pos = [], 0, 0
    while (m := _SCHEME.search(line, pos)) is not None and m.end() < last:
        start = m.end()
        user = _USER.match(line, start).end()
        if user < len(line) and line[user] == ":" and last > user:
            at = last  # user:password@
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
    """YAML block scalars under secret names redacted."""
    out, done, pos = [], 0, 0
    while (m := _BLOCK.search(text, pos)) is not None:
        pos = m.end() + 1
        if not is_secret_name(m["name"]):
            continue
        depth, end, body = len(m["indent"]), m.end(), []
        while end < len(text):  # the lines indented deeper, blank ones within
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


# Secrets known by value (preflight's job key).
_KNOWN: set[str] = set()
_KEY_ENV = "LOCKSTEP_JOB_KEY"
_MIN_KNOWN = 8  # shorter values would redact ordinary words


def add_secret_value(value: str) -> None:
    """Redact `value` wherever it stands from now on."""
    if len(value) >= _MIN_KNOWN:
        _KNOWN.add(value)


def _known_values(text: str) -> str:
    env = {os.environ.get(_KEY_ENV, "").strip(), _key_file_text()}
    for value in _KNOWN | {v for v in env if len(v) >= _MIN_KNOWN}:
        if value in text:
            text = text.replace(value, redacted(value))
    return text


# The job key file's text, read once a process per path.
_KEY_FILE_ENV = "LOCKSTEP_JOB_KEY_FILE"
_FILE_KEYS: dict[str, str] = {}


def _key_file_text() -> str:
    path = os.environ.get(_KEY_FILE_ENV, "")
    if path and path not in _FILE_KEYS:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
        try:
            fd = os.open(path, flags)
        except OSError:
            return ""  # not cached: the file may appear later
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                _FILE_KEYS[path] = os.read(fd, 4096).decode(errors="replace").strip()
        except OSError:
            pass
        finally:
            os.close(fd)
    return _FILE_KEYS.get(path, "")


def scrub_text(text: str) -> str:
    """`text` with every secret in it redacted."""
    if not isinstance(text, str):
        text = str(text)
    text = _known_values(text)
    text = _PEM.sub(lambda m: redacted(m.group(0)), text)
    text = pem_bodies(text)
    if ":" in text:
        text = _blocks(text)
    if "://" in text and "@" in text:
        text = "\n".join(
            _url_line(line) if "://" in line and "@" in line else line for line in text.split("\n")
        )
    text = _WEBHOOK.sub(lambda m: m.group(0)[: m.start("v") - m.start()] + redacted(m["v"]), text)
    text = _TOKEN_SHAPES.sub(lambda m: redacted(m.group(0)), text)
    text = wandb_logins(user_passwords(text))
    if "password" in text:
        text = _NETRC.sub(_group_v, text)
    if "-p" in text:
        text = "\n".join(_mysql_line(line) for line in text.split("\n"))
    text = _BASE64.sub(_basic_credentials, text)
    for form in _FORMS:
        text = _sub(form, text)
    return text


def _group_v(m: re.Match) -> str:
    g = "v" if m["v"] is not None else "w"
    whole, start, end = m.group(0), m.start(g) - m.start(), m.end(g) - m.start()
    return whole[:start] + redacted(m[g]) + whole[end:]


def _mysql_line(line: str) -> str:
    """A line's `-pPASSWORD` after a MySQL client's name redacted."""
    m = _MYSQL.search(line) if "-p" in line else None
    if m is None:
        return line
    return line[: m.end()] + _GLUED_P.sub(_group_v, line[m.end() :])


def _basic_credentials(m: re.Match) -> str:
    """A base64 word redacted when it decodes to `user:secret` or to JSON holding a secret."""
    try:
        decoded = base64.b64decode(m.group(0), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return m.group(0)
    if _BASIC.fullmatch(decoded):
        return redacted(m.group(0))
    if decoded.lstrip().startswith(("{", "[")) and scrub_text(decoded) != decoded:
        return redacted(m.group(0))
    return m.group(0)


def escape_controls(name: str) -> str:
    """A name for a terminal: its control characters as `\\xNN` escapes."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
