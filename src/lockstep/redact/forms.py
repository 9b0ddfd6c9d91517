"""Secrets `text`'s name/value forms cannot see, each found by a scan of its own."""

from __future__ import annotations

import re

from lockstep.redact.names import redacted

# A private key's first bytes in base64 (the DER's version INTEGER, which public keys and
# certificates lack), per length encoding; and OpenSSH's `openssh-key-v1`.
_BODY_START = re.compile(
    r"(?<![A-Za-z0-9+/])(?:MI[I-L][A-Za-z0-9+/]{2}[AQgw]IBA|MI[E-H][A-Za-z0-9+/]AgE[AB]"
    r"|M[A-P][A-Za-z0-9+/]CAQ[A-H]|b3BlbnNzaC1rZXktdjE)"
)
_RUN = re.compile(r"[A-Za-z0-9+/]*={0,2}")
# between the lines of a body: a newline, indented or escaped
_SEP = re.compile(r"[ \t]*(?:\r?\n|\\r\\n|\\n)[ \t]*")
_SEGMENT_END = re.compile(r"[ \t]*(?:\r?\n|\\[rn]|[\"',]|$)")
_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
MIN_BODY = 40  # shorter runs are words by chance
FULL_LINE = 60  # PEM wraps at 64: a shorter line is the body's last


def pem_bodies(text: str) -> str:
    """Private keys' bodies with no BEGIN line before them redacted."""
    out, done, pos = [], 0, 0
    while (m := _BODY_START.search(text, pos)) is not None:
        end = _RUN.match(text, m.start()).end()
        pos = m.end()
        if end - m.start() < MIN_BODY:
            continue
        segment = end - m.start()
        while segment >= FULL_LINE and (sep := _SEP.match(text, end)) is not None:
            run = _RUN.match(text, sep.end())
            if run.end() == sep.end() or not _SEGMENT_END.match(text, run.end()):
                break
            end, segment = run.end(), run.end() - sep.end()
        if (sep := _SEP.match(text, end)) is not None and (e := _END.match(text, sep.end())):
            end = e.end()
        out += [text[done : m.start()], redacted(text[m.start() : end])]
        done = pos = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


_B64_LINE = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def body_line(line: str) -> int:
    """`line`'s length if it is one segment of base64 only, else 0."""
    segment = line.strip()
    return len(segment) if _B64_LINE.fullmatch(segment) else 0


def body_continues(line: str, inside: bool) -> bool:
    """Whether `pem_bodies` may take the line after `line` too."""
    if inside:
        return body_line(line) >= FULL_LINE
    tail = line.rstrip(" \t\r")
    for m in _BODY_START.finditer(tail):
        end = _RUN.match(tail, m.start()).end()
        if end == len(tail):
            return end - m.start() >= FULL_LINE
    return False


# curl's `-u user:password` (`-U`, `--user`, `--proxy-user`): the password goes. `-u` is many
# tools' (`python -u`): it counts after curl only.
_CURL = re.compile(r"\bcurl\b")
_USER_FLAG = re.compile(
    r"(?<![\w-])(?:--(?:proxy-)?user(?:[ \t]+|=)|(?P<short>-[uU])[ \t]*)"
    r"(?:(?P<q>[\"'])[^\s:\"'$]*:(?P<v>(?:(?!(?P=q))[^\n])+)|[^\s:\"'$]*:(?P<w>[^\s\"'`]+))"
)
_UID_GID = re.compile(r"\d+")


def user_passwords(text: str) -> str:
    """The passwords after curl's user flags redacted, line by line."""
    if "-u" not in text and "-U" not in text:  # `--user` holds "-u" too
        return text
    return "\n".join(
        _user_line(line) if "-u" in line or "-U" in line else line for line in text.split("\n")
    )


def _user_line(line: str) -> str:
    curl = _CURL.search(line)

    def password(m: re.Match) -> str:
        g = "v" if m["v"] is not None else "w"
        value = m[g]
        if m["short"] and (curl is None or curl.start() > m.start()):
            return m[0]
        if _UID_GID.fullmatch(value) or value.startswith(("$", "<redacted:")):
            return m[0]
        start, end = m.start(g) - m.start(), m.end(g) - m.start()
        return m[0][:start] + redacted(value) + m[0][end:]

    return _USER_FLAG.sub(password, line)


# `wandb login KEY`: a word of a key's shape after it.
_WANDB_LOGIN = re.compile(r"\bwandb[ \t]+login\b[^\n]*")
_KEY_WORD = re.compile(r"(?<![\w./:-])(?=[\w-]*\d)[\w-]{32,}(?![\w./:-])")


def wandb_logins(text: str) -> str:
    if "wandb" not in text:
        return text
    return _WANDB_LOGIN.sub(lambda m: _KEY_WORD.sub(lambda k: redacted(k.group(0)), m[0]), text)
