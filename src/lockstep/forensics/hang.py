"""The report on a folder of flight-recorder dumps, read in a process of its own (`reader`),
with the ranks gloo aborted that the launch's log names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from lockstep.forensics import analysis, bounds, reader

MISMATCH = "Received data size doesn't match expected size"
# gloo's enforce message before it: "op.preamble.length <= op.nbytes. 8 vs 4. "
SIZES = re.compile(r"(\d{1,20}) vs (\d{1,20})\. $")
# torchrun's failure summary; no unbounded gap: the log holds the ranks' output
FAILED_RANK = re.compile(
    r"rank\s*:\s*(\d{1,7}) \(local_rank: \d+\)\n[ \t]*exitcode[ \t]*:[ \t]*(-?\d{1,4})"
)
SRC = Path(__file__).resolve().parents[2]  # the folder holding lockstep/
BOOT = "import sys; sys.path.append(sys.argv[1]); from lockstep.forensics import reader; reader.main(sys.argv[2:])"  # fmt: skip


def clear(folder: Path) -> None:
    """An empty dumps folder for a new launch (lockstep owns it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_symlink() or not path.is_dir():
            path.unlink()


def report(folder: Path, log_text: str | None = None, world: int | None = None,
           strict: bool = False) -> analysis.Report:  # fmt: skip
    """The `analysis.Report` on the dumps in `folder` (`log_text`: the launch's log); past a
    bound, OutOfBounds when `strict`; `Report.dead` when the reader gave none."""
    options = {"world": world, "strict": strict, "gloo": _gloo(log_text or ""),
               "memory": bounds.MAX_MEMORY, "seconds": bounds.MAX_SECONDS,
               "deadline": time.monotonic() + bounds.MAX_SECONDS, "space": bounds.MAX_SPACE,
               "cpu": bounds.MAX_CPU}  # fmt: skip
    argv = [sys.executable, "-I", "-S", "-c", BOOT, str(SRC), os.fspath(folder), json.dumps(options)]  # fmt: skip
    wall = 3 * bounds.MAX_CPU + 2  # its CPU limit first, even with a third of a busy core
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=wall)
    except subprocess.TimeoutExpired:
        return _dead(f"the reader ran past {wall} s and was killed", strict)
    if done.returncode:
        return _dead(_death(done), strict)
    reply = json.loads(done.stdout)
    return _dead(reply["error"], strict) if "error" in reply else _rebuild(reply["report"])


def _death(done: subprocess.CompletedProcess) -> str:
    """The reader's death, in words, with the limit that killed it."""
    space, cpu = bounds.mib(bounds.MAX_SPACE), bounds.MAX_CPU
    last = (done.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
    if done.returncode == reader.EXIT_MEMORY or "MemoryError" in last:
        return f"the reader ran out of its {space} of address space (RLIMIT_AS)"
    if done.returncode == -signal.SIGXCPU:
        return f"the reader used up its {cpu} s of CPU (RLIMIT_CPU)"
    if done.returncode == -signal.SIGKILL:
        return f"the reader was killed (SIGKILL: past its {cpu} s of CPU, or its {space})"
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return f"the reader died ({how}){': ' + bounds.shown(last, 300) if last else ''}"


def _dead(why: str, strict: bool) -> analysis.Report:
    if strict:
        raise bounds.OutOfBounds(why)
    result = analysis.Report([], [], {}, [why])
    result.dead = why
    return result


def _rebuild(d: dict) -> analysis.Report:
    """The `analysis.Report` the reader wrote as JSON."""
    findings = [
        analysis.Finding(**{**f, "groups": [analysis.Group(**g) for g in f["groups"]],
                            "stacks": {int(r): s for r, s in f["stacks"].items()}})
        for f in d["findings"]
    ]  # fmt: skip
    versions = {int(r): v for r, v in d["versions"].items()}
    return analysis.Report(findings, d["no_dump"], versions, d["problems"], d["empty"])


def _gloo(text: str) -> list | None:
    """[received, expected, ranks that died of SIGABRT] when the log shows gloo's abort on a
    size mismatch; the literal first (a regex starting on digits is quadratic)."""
    at = text.find(MISMATCH)
    while at >= 0:
        sizes = SIZES.search(text, max(0, at - 48), at)
        if sizes:
            aborted = [int(r) for r, code in FAILED_RANK.findall(text) if code == "-6"]
            return [*sizes.groups(), aborted]
        at = text.find(MISMATCH, at + 1)
    return None


def summary(folder: Path, log_text: str | None = None, world: int | None = None,
            findings_only: bool = False) -> str:  # fmt: skip
    """`; flight recorder: HEADLINES (report: FOLDER/report.txt)` for a failed launch's error,
    or '' (no dump; with `findings_only`, nobody out of step)."""
    from lockstep.redact import scrub_text

    if not folder.is_dir():
        return ""
    result = report(folder, log_text, world)
    if result.dead:
        return f"; flight recorder: {result.dead} ({folder})"
    if not result.versions and not any(folder.glob("rank_*.stacks")):
        return ""
    if findings_only and not result.findings:
        return ""
    whole = folder / "report.txt"
    headlines = [scrub_text(ln) for ln in result.lines() if not ln.startswith(" ")]
    try:  # a new file: never through a link or a FIFO a rank left under that name
        whole.unlink(missing_ok=True)
        fd = os.open(whole, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(scrub_text(result.text()) + "\n")
    except OSError as err:
        return f"; flight recorder: {'; '.join(headlines)} (report.txt: {err.strerror})"
    return f"; flight recorder: {'; '.join(headlines)} (report: {whole})"
