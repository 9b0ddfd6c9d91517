"""The reader of a folder of dumps, in a fresh interpreter of its own under RLIMIT_AS and
RLIMIT_CPU (started by `hang.report`): its report, or an error, as JSON on stdout.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
from dataclasses import asdict
from pathlib import Path

from lockstep.forensics import analysis, bounds, dumps

EXIT_MEMORY = 3


def main(argv: list[str]) -> None:
    """The reader's process: its report on stdout, then out without the interpreter's
    teardown."""
    folder, options = Path(argv[0]), json.loads(argv[1])
    _limit(resource.RLIMIT_AS, options["space"], options["space"])
    _limit(resource.RLIMIT_CPU, options["cpu"], options["cpu"] + 1)  # SIGXCPU, then SIGKILL
    _limit(resource.RLIMIT_CORE, 0, 0)
    gc.disable()  # a dump holds no cycle (`unpickle` refuses one)
    try:
        budget = bounds.Budget(options["memory"], options["seconds"])
        budget.deadline = options["deadline"]  # the caller's: CLOCK_MONOTONIC is system-wide
        result = read(folder, budget, options["world"], options["strict"], options["gloo"])
        budget.clock()  # before rendering
        out = json.dumps({"report": asdict(result)}, default=str)
        if len(out) > bounds.MAX_REPORT:
            raise bounds.OutOfBounds(f"a report over {bounds.mib(bounds.MAX_REPORT)}")
    except bounds.OutOfBounds as err:
        out = json.dumps({"error": str(err)})
    except OSError as err:
        out = json.dumps({"error": err.strerror or type(err).__name__})
    except MemoryError:
        os._exit(EXIT_MEMORY)
    sys.stdout.write(out)
    sys.stdout.flush()
    os._exit(0)


def _limit(which: int, soft: int, hard: int) -> None:
    """Lowers a limit, never above the one inherited (setrlimit refuses to raise a hard one)."""
    _, inherited = resource.getrlimit(which)
    if inherited != resource.RLIM_INFINITY:
        soft, hard = min(soft, inherited), min(hard, inherited)
    resource.setrlimit(which, (soft, hard))


def read(folder: Path, budget: bounds.Budget, world: int | None = None, strict: bool = False,
         gloo: list | None = None) -> analysis.Report:  # fmt: skip
    """The `analysis.Report` on the dumps in `folder` within `budget` (`hang.report`'s
    arguments)."""
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
                raise bounds.OutOfBounds(f"{bounds.shown(path.name)}: {err}") from None
            problems.append(f"{bounds.shown(path.name)}: {err}")
            break
        except OSError:
            continue
    result = analysis.analyse({r: d.data for r, d in found.items()}, stacks=stacks,
                              world=world, problems=problems, clock=budget.clock)  # fmt: skip
    if gloo:
        _aborted(result, gloo, {r: d.data for r, d in found.items()}, budget.clock)
    return result


def _aborted(result, gloo: list, found: dict[int, dict], clock) -> None:
    """Name the ranks gloo aborted (no dump) at the collective the others wait in, or else at
    the last they all entered."""
    got, expected, ranks = gloo
    aborted = sorted(set(ranks) - set(found))
    who = analysis.ranks_text(aborted) if aborted else "a rank"
    note = (f"{who} aborted in gloo: received {got} bytes where its own call expected "
            f"{expected} (\"Received data size doesn't match expected size\")")  # fmt: skip
    if not result.findings and aborted and found:
        last = analysis.last_agreed(found, clock)
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
