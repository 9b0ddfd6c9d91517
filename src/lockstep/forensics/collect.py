"""The launching side: the ranks' environment for recording and dumping, asking live ranks
for their dumps, scrubbing the stacks they wrote."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from lockstep.compat import FR_BUFFER_ENV
from lockstep.forensics.bounds import MAX_BYTES, DumpError, read_regular
from lockstep.forensics.recorder import DIR_ENV, PID_ENV, TRIGGER

SITE = Path(__file__).resolve().parent / "site"
BUFFER = "2000"  # torch's default


def environ(env: dict, folder: Path, site: bool = True) -> dict:
    """`env` with what a rank needs to record and dump into `folder` (made here); without
    `site`, for ranks that install the watcher themselves."""
    folder.mkdir(parents=True, exist_ok=True)
    out = dict(env)
    out.pop(PID_ENV, None)  # a launch from inside a rank starts ranks of its own
    if not any(name in out for name in FR_BUFFER_ENV):
        out[FR_BUFFER_ENV[0]] = BUFFER
    out[DIR_ENV] = str(folder)
    if not site:
        return out
    path = [str(SITE), *(p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out["PYTHONPATH"] = os.pathsep.join(path)
    return out


def request(folder: Path, nproc: int, wait: float = 5.0) -> list[int]:
    """Ask the ranks for their dumps; the ranks that answered within `wait` seconds."""
    (folder / TRIGGER).touch()
    deadline = time.monotonic() + wait
    while True:  # only the ranks asked: a script can put any name in the folder
        answered = [r for r in answered_ranks(folder) if r < nproc]
        if len(answered) >= nproc or time.monotonic() > deadline:
            return answered
        time.sleep(0.1)


def answered_ranks(folder: Path) -> list[int]:
    """The ranks that wrote their stacks (the last file a dump writes)."""
    return sorted(int(p.name[5:-7]) for p in folder.glob("rank_*.stacks") if p.name[5:-7].isdigit())


def scrub(folder: Path) -> None:
    """Redact the ranks' Python stacks in `folder` once the launch is over; regular files
    only, never through a link."""
    from lockstep.redact import scrub_text

    for path in folder.glob("rank_*.stacks"):
        try:
            data = read_regular(path, MAX_BYTES, cut=True)
        except (OSError, DumpError):
            continue
        text = data.decode("utf-8", "replace")
        clean = scrub_text(text)
        if clean == text and len(data) < MAX_BYTES:
            continue
        flags = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                out.write(clean)  # past MAX_BYTES, cut: no faulthandler dump is that long
