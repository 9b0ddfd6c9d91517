"""What a local check is: a row of the registry, and the result it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockstep.launch.detect import RankInfo


def result(name: str, status: str, detail: str) -> dict[str, str]:
    """One check's finding: `status` ok, warn, fail or skip; `detail` one line for the report
    (quote the message users would otherwise meet later)."""
    return {"name": name, "status": status, "detail": detail}


@dataclass(frozen=True)
class LocalCheck:
    """A row of `registry.LOCAL_CHECKS`.

    `run(info, torch)` returns `result(...)` or None (nothing to check here). `blocks`: the
    backends (gloo, nccl) whose process group a failure breaks on that node, so that the
    preflight stops at the check-in naming the nodes, before a collective could hang on it.
    `fatal`: a failure leaves this rank no way to meet its peers; it ends at once, and the
    others name it as missing."""

    name: str
    run: Callable[[RankInfo, Any], dict[str, str] | None]
    blocks: tuple[str, ...] = ()
    fatal: bool = False
