"""Secrets that `text`'s name/value forms cannot see, each found by a scan of its own, linear in
the text: a private key's base64 body without its BEGIN line, a password after curl's `-u` or
`--user`, a key after `wandb login`. `scrub_text` runs them; `stream` asks `body_continues`
whether a key's body may go on in the next line."""

from __future__ import annotations

import re

from lockstep.redact.names import redacted

# The first bytes of a private key's DER (a SEQUENCE, then the version INTEGER 0 or 1, which
# public keys and certificates lack) in base64, for each length encoding: PKCS#1 and PKCS#8
# RSA/DSA/EC, SEC1 EC, Ed25519/Ed448; and OpenSSH's own format (`openssh-key-v1`).
_BODY_START = re.compile(
    r"(?<![A-Za-z0-9+/])(?:MI[I-L][A-Za-z0-9+/]{2}[AQgw]IBA|MI[E-H][A-Za-z0-9+/]AgE[AB]"
    r"|M[A-P][A-Za-z0-9+/]CAQ[A-H]|b3BlbnNzaC1rZXktdjE)"
)
_RUN = re.compile(r"[A-Za-z0-9+/]*={0,2}")
# between the lines of a body: a newline (indented, or `\n` escaped in a JSON string)
_SEP = re.compile(r"[ \t]*(?:\r?\n|\\r\\n|\\n)[ \t]*")
_SEGMENT_END = re.compile(r"[ \t]*(?:\r?\n|\\[rn]|[\"',]|$)")
_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
MIN_BODY = 40  # shorter runs are words by chance
FULL_LINE = 60  # PEM wraps at 64 (70 OpenSSH, 76 MIME): a shorter line is the body's last


def pem_bodies(text: str) -> str:
    """Private keys' bodies redacted where no BEGIN line stands before them: from the first
    bytes (`_BODY_START`) through every following full line of base64, the last shorter one
    and an END line right after."""
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
    """The length of `line` when it is one segment of base64 and nothing else, else 0."""
    segment = line.strip()
    return len(segment) if _B64_LINE.fullmatch(segment) else 0


def body_continues(line: str, inside: bool) -> bool:
    """Whether `pem_bodies` may take the next line too: `line` (no newline) ends in a key's
    body of a full line's length, its first line or (`inside` one) a later one."""
    if inside:
        return body_line(line) >= FULL_LINE
    tail = line.rstrip(" \t\r")
    for m in _BODY_START.finditer(tail):
        end = _RUN.match(tail, m.start()).end()
        if end == len(tail):
            return end - m.start() >= FULL_LINE
    return False


# curl's `-u user:password` (`-U`, `--user`, `--proxy-user`, glued or after `=`, quoted or not):
# the password goes, the user stays. `-u` is many tools' (`python -u`, `docker run -u uid:gid`):
# it counts on a line that runs curl only. A uid:gid or a `$VAR` is no password.
_CURL = re.compile(r"\bcurl\b")
_USER_FLAG = re.compile(
    r"(?<![\w-])(?:--(?:proxy-)?user(?:[ \t]+|=)|(?P<short>-[uU])[ \t]*)"
    r"(?:(?P<q>[\"'])[^\s:\"'$]*:(?P<v>(?:(?!(?P=q))[^\n])+)|[^\s:\"'$]*:(?P<w>[^\s\"'`]+))"
)
_UID_GID = re.compile(r"\d+")


def user_passwords(text: str) -> str:
    """The passwords of `user:password` after curl's user flags redacted (`_USER_FLAG`), line
    by line (a `-u` counts after `curl` on its line)."""
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


# `wandb login KEY` (`--relogin`, `--host URL` around it): any word of a key's shape on the rest
# of the line (40 hex characters, or a longer token with a digit).
_WANDB_LOGIN = re.compile(r"\bwandb[ \t]+login\b[^\n]*")
_KEY_WORD = re.compile(r"(?<![\w./:-])(?=[\w-]*\d)[\w-]{32,}(?![\w./:-])")


def wandb_logins(text: str) -> str:
    if "wandb" not in text:
        return text
    return _WANDB_LOGIN.sub(lambda m: _KEY_WORD.sub(lambda k: redacted(k.group(0)), m[0]), text)
