"""The report on a launch's (or a job's own) folder of flight-recorder dumps: the dumps read
(`dumps`), analysed (`analysis`), and what the launch's log adds: ranks gloo aborted on a
size mismatch ("Received data size doesn't match expected size") leave no dump, but the log
names them and the sizes they saw."""

from __future__ import annotations

import re
from pathlib import Path

from lockstep.forensics import analysis, bounds, dumps
from lockstep.forensics.recorder import TRIGGER

# gloo's enforce message: "op.preamble.length <= op.nbytes. 8 vs 4. Received data size ..."
SIZE_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
# torchrun's failure summary, one block a rank
FAILED_RANK = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?exitcode\s*:\s*(-?\d+)", re.S)


def clear(folder: Path) -> None:
    """An empty dumps folder for a new launch (lockstep owns it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file():
            path.unlink()


def report(folder: Path, log_text: str | None = None, world: int | None = None,
           strict: bool = False):  # fmt: skip
    """The `analysis.Report` on the dumps in `folder`; `log_text`, the launch's log, adds the
    ranks gloo aborted on a size mismatch. Within `bounds` whatever the folder holds:
    `strict`, OutOfBounds past one (`lockstep forensics hang`), else a line of the report's
    problems says so."""
    budget = bounds.Budget()
    found, problems = dumps.load_dir(folder, budget, strict)
    stacks = {r: d.stacks for r, d in found.items() if d.stacks}
    for seen, path in enumerate(folder.glob("rank_*.stacks")):  # stacks, but no dump
        rank = path.name[5:-7]
        if seen > bounds.MAX_FILES:
            break
        if not (rank.isdigit() and len(rank) < 7 and int(rank) not in stacks):
            continue
        try:
            stacks[int(rank)] = dumps.read_stacks(path, budget)
        except bounds.OutOfBounds as err:
            if strict:
                raise
            problems.append(f"{bounds.shown(path.name)}: {err}")
            break
        except OSError:
            continue
    problems = [p for p in problems if not p.startswith(TRIGGER)]
    result = analysis.analyse({r: d.data for r, d in found.items()}, stacks=stacks,
                              world=world, problems=problems,
                              clock=budget.clock if strict else None)  # fmt: skip
    if log_text:
        _aborted(result, log_text, {r: d.data for r, d in found.items()})
    return result


def summary(folder: Path, log_text: str | None = None, world: int | None = None,
            findings_only: bool = False) -> str:  # fmt: skip
    """For a timed-out or crashed launch's one-line error: `; flight recorder: HEADLINES
    (report: FOLDER/report.txt)`, the headlines being who is out of step in which collective;
    the whole report, every odd rank's Python stack included, is written scrubbed beside the
    dumps as report.txt. '' when no rank left a dump or its stacks, or, with `findings_only`
    (a crash, whose own traceback says more), when nobody is out of step."""
    from lockstep.redact import scrub_text

    if not folder.is_dir():
        return ""
    result = report(folder, log_text, world)
    if not result.versions and not any(folder.glob("rank_*.stacks")):
        return ""
    if findings_only and not result.findings:
        return ""
    whole = folder / "report.txt"
    whole.write_text(scrub_text(result.text()) + "\n")
    headlines = [scrub_text(ln) for ln in result.lines() if not ln.startswith(" ")]
    return f"; flight recorder: {'; '.join(headlines)} (report: {whole})"


def _aborted(result, text: str, found: dict[int, dict]) -> None:
    """Name the ranks gloo aborted on a size mismatch (no dump: the log's exit codes say -6)
    as the ones whose sizes differ where the others agree, at the collective the others wait
    in or, when none waits, the last one they all entered (`analysis.last_agreed`)."""
    sizes = SIZE_MISMATCH.search(text)
    if not sizes:
        return
    aborted = sorted({int(r) for r, code in FAILED_RANK.findall(text) if code == "-6"} - set(found))
    got, expected = sizes.groups()
    who = analysis.ranks_text(aborted) if aborted else "a rank"
    note = (f"{who} aborted in gloo: received {got} bytes where its own call expected "
            f"{expected} (\"Received data size doesn't match expected size\")")  # fmt: skip
    if not result.findings and aborted and found:
        last = analysis.last_agreed(found)
        if last is not None:
            name, seq, group = last
            result.findings.append(
                analysis.Finding(name, seq, [group], [], group.ranks, "", "sizes differ")
            )
    if not result.findings:
        result.problems.append(note)
        return
    f = result.findings[0]
    if len(f.groups) == 1 and aborted:  # the others agree: the aborted rank's sizes differ
        g = f.groups[0]
        f.headline = (
            f"{who}'s {g.op} #{f.seq} differs in size: {note}; "
            f"{analysis.ranks_text(g.ranks)} entered {g.op} #{f.seq} with "
            f"{analysis.sizes_text(g.input_sizes, g.input_dtypes)}"
        )
        f.odd, f.kind = aborted, "sizes differ"
        result.no_dump = [r for r in result.no_dump if r not in aborted]
    else:
        f.headline += f"; {note}"
