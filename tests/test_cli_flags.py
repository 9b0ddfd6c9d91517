"""Every command's flags, types, defaults and choices, as the `lockstep` parser declares them,
held against a committed snapshot: a change to what a user types is a change to the snapshot.

Regenerate after a deliberate change: `python tests/test_cli_flags.py > tests/fixtures/cli-flags.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lockstep.cli import build_parser

SNAPSHOT = Path(__file__).parent / "fixtures" / "cli-flags.json"


def _plain(value):
    if isinstance(value, Path):
        return f"Path({value})"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def flags(parser: argparse.ArgumentParser, prefix: str = "lockstep") -> dict:
    """{command: {dest: what a user can type and what it defaults to}}, every subcommand."""
    out: dict = {}
    mine = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(flags(sub, f"{prefix} {name}"))
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        mine[action.dest] = {
            "flags": list(action.option_strings),
            "action": type(action).__name__,
            "type": getattr(action.type, "__name__", None),
            "default": _plain(action.default),
            "choices": _plain(list(action.choices)) if action.choices else None,
            "nargs": action.nargs,
            "required": action.required,
        }
    out[prefix] = mine
    return out


def test_every_commands_flags_match_the_snapshot():
    assert flags(build_parser()) == json.loads(SNAPSHOT.read_text())


if __name__ == "__main__":
    print(json.dumps(flags(build_parser()), indent=1, sort_keys=True))
