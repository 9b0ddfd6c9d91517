"""`lockstep gate`: record, check, compare, refresh, ab, alerts: their parsers, declared in
`gate.options`; the work is in `gate.commands`.

Exit codes: 0 pass, 1 regression (or an alert fired), 2 bad input or no golden for this
environment, 3 timeout, 4 not judged (a speed or memory threshold too wide to judge).
"""

from __future__ import annotations

from lockstep import flags
from lockstep.errors import EXIT_USAGE
from lockstep.gate.options import ABRun, AlertsRun, CompareRun, GateRun

COMMANDS = "lockstep.gate.commands"  # imported when a command runs
RUNS_A_JOB = (
    ("record", "run the job R times and write its golden"),
    ("refresh", "record anew and show what moves from the old golden"),
    ("check", "run the job once and compare it with its golden"),
)


def register(subparsers) -> None:
    gate = subparsers.add_parser(
        "gate",
        help="regression gates: goldens per environment, performance A/B, alert rules",
        description="Did this change make training worse than main did? Goldens live in "
        "DIR/NAME/ENV-KEY.json (default dir: gates).",
    )
    sub = gate.add_subparsers(dest="gate_command", metavar="GATE_COMMAND")
    gate.set_defaults(func=lambda args: _usage(gate))
    for name, what in RUNS_A_JOB:
        only_check = () if name == "check" else ("candidate", "reports")
        run = f"{COMMANDS}:{name}"
        flags.command(
            sub, name, GateRun, run, exclude=only_check, given={"command": name}, help=what
        )
    flags.command(
        sub, "compare", CompareRun, f"{COMMANDS}:compare",
        help="compare a metrics file a run already wrote",
    )  # fmt: skip
    flags.command(
        sub, "ab", ABRun, f"{COMMANDS}:compare_ab",
        help="alternate base REF and the working tree; judge speed/memory",
    )  # fmt: skip
    flags.command(
        sub, "alerts", AlertsRun, f"{COMMANDS}:evaluate_alerts",
        help="evaluate alert rules over a metrics file",
    )  # fmt: skip


def _usage(parser) -> int:
    parser.print_help()
    return EXIT_USAGE
