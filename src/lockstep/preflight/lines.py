"""How preflight writes ranks and errors into its one-line messages."""

from __future__ import annotations

from collections.abc import Iterable

from lockstep.redact import scrub_text


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': rank lists stay short at 1000 ranks."""
    parts: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def first_line(err: BaseException, limit: int | None = None) -> str:
    """An error's first line, scrubbed of credentials (torch's errors run to C++ stacks)."""
    line = scrub_text((str(err).strip().splitlines() or [repr(err)])[0])
    return line if limit is None else line[:limit]
