"""`lockstep check NAME CONFIG` (lockstep's own harness, any engine) and
`lockstep check NAME --script CMD` (a user's script): training invariant checks. The parser,
declared by `plans.Request`; the work is in `checks.command` and `checks.plans`.

Exit codes: 0 every check passed, 1 a check failed, 2 bad input (including a script that
crashes or ignores the protocol), 3 a run timed out, 4 a check could not judge (it says why).
"""

from __future__ import annotations

import argparse

from lockstep import flags
from lockstep.checks.plans import Request


def register(sub: argparse._SubParsersAction) -> None:
    flags.command(
        sub, "check", Request, "lockstep.checks.command:check",
        help="run training invariant checks on a run config or on your own script",
        description="With CONFIG: train lockstep's reference job (any engine) in local ranks "
        "and check determinism, resume, clip, equivalence, world-size, accumulation or "
        "elastic. With --script: launch your training script through torchrun several times "
        "and compare the per-step metrics it logs with lockstep.track.log (determinism, "
        "resume, world-size, replicas; see docs/scripts.md).",
    )  # fmt: skip

