"""The job options `check`, `gate` and `train` share are declared once (`lockstep.job_options`):
every command that takes one has it with the same default, read from the real parser of the
`lockstep` command; and below each `cli.py` no code knows argparse."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from lockstep import job_options
from lockstep.cli import build_parser

SRC = Path(job_options.__file__).parent
SHARED = {
    "config": None,
    "script": None,
    "overrides": [],
    "nproc": 2,
    "steps": None,
    "timeout": 1800.0,
    "run_path": False,
}
# The commands that run a job, and the shared options each declares.
COMMANDS = {
    ("check",): set(SHARED),
    ("gate", "record"): set(SHARED),
    ("gate", "refresh"): set(SHARED),
    ("gate", "check"): set(SHARED),
    ("gate", "ab"): set(SHARED),
    ("train",): {"config", "overrides", "nproc", "timeout"},
}


def subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


def declared(path: tuple[str, ...]) -> dict[str, argparse.Action]:
    return {a.dest: a for a in subparser(build_parser(), path)._actions if a.dest in SHARED}


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_each_command_declares_the_shared_options_with_the_one_default(path):
    actions = declared(path)
    assert set(actions) == COMMANDS[path]
    assert {dest: a.default for dest, a in actions.items()} == {
        dest: SHARED[dest] for dest in COMMANDS[path]
    }
    assert {dest: a.option_strings for dest, a in actions.items()} == {
        dest: declared(("check",))[dest].option_strings for dest in COMMANDS[path]
    }


def test_the_defaults_are_the_modules_and_the_options_objects():
    assert (SHARED["nproc"], SHARED["timeout"]) == (job_options.NPROC, job_options.TIMEOUT_S)
    job = job_options.JobOptions()
    assert (job.nproc, job.timeout, job.steps) == (2, 1800.0, None)
    from lockstep.checks.plans import Request
    from lockstep.train.start import TrainOptions

    assert (Request("all").nproc, Request("all").timeout) == (2, 1800.0)
    assert (TrainOptions("c.toml").nproc, TrainOptions("c.toml").timeout) == (2, 1800.0)


def test_parsed_options_become_a_frozen_object():
    args = build_parser().parse_args(
        ["gate", "check", "g", "--script", "t.py", "--set", "a=1", "--steps", "4", "--run-path"]
    )
    job = job_options.job_of(args)
    assert job == job_options.JobOptions(script="t.py", overrides=("a=1",), steps=4, run_path=True)
    with pytest.raises(AttributeError):
        job.nproc = 1


def test_a_scripts_default_steps_in_the_help_are_the_commands_own():
    from lockstep.checks import cli as check_cli
    from lockstep.checks import plans
    from lockstep.gate import cli as gate_cli
    from lockstep.gate.job import DEFAULT_SCRIPT_STEPS

    assert (check_cli.SCRIPT_STEPS, gate_cli.SCRIPT_STEPS) == (
        plans.SCRIPT_STEPS,
        DEFAULT_SCRIPT_STEPS,
    )
    assert f"{plans.SCRIPT_STEPS} with --script" in declared(("check",))["steps"].help
    assert f"{DEFAULT_SCRIPT_STEPS} with --script" in declared(("gate", "check"))["steps"].help


@pytest.mark.parametrize("package", ["checks", "gate", "train"])
def test_only_the_cli_module_knows_argparse(package):
    """Each command's cli.py parses and builds an options object; the code below takes that."""
    for path in sorted((SRC / package).rglob("*.py")):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert "argparse" not in names, f"{path.relative_to(SRC)} imports argparse"
