"""`lockstep check NAME CONFIG` and `lockstep check NAME --script CMD`: the parser, declared by
`plans.Request`.
"""

from __future__ import annotations

import argparse

from lockstep import flags
from lockstep.checks.plans import Request


def register(sub: argparse._SubParsersAction) -> None:
    flags.command(
        sub, "check", Request, "lockstep.checks.plans:check",
        help="run training invariant checks on a run config or on your own script",
        description="With CONFIG: train lockstep's reference job (any engine) in local ranks "
        "and check determinism, resume, clip, equivalence, world-size, accumulation or "
        "elastic. With --script: launch your training script through torchrun several times "
        "and compare the per-step metrics it logs with lockstep.track.log (determinism, "
        "resume, world-size, replicas; see docs/scripts.md).",
    )  # fmt: skip
