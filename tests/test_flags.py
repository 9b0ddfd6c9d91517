"""Every command's options are declared once (`lockstep.flags`): the parser, the options object
and a rank's argv come from the declaration, and a help text cannot state another default."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path
from typing import ClassVar

import pytest

from lockstep import flags, job_options
from lockstep.cli import build_parser
from lockstep.flags import DeclarationError, flag

SRC = Path(job_options.__file__).parent


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every command that runs something (the leaves)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from commands(child, (*path, name))


LEAVES = dict(commands(build_parser()))


def parse(cls: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    flags.add(parser, cls)
    return parser


def test_a_flag_without_help_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Planted:
        depth: int = flag("--depth", type=int, default=3, help=" ")

    with pytest.raises(DeclarationError, match=r"Planted.depth: a flag without help"):
        parse(Planted)


@pytest.mark.parametrize("text", ["layers (default 5)", "layers; defaults to 5", "Default: 5"])
def test_a_help_stating_a_default_itself_is_refused(text):
    @dataclasses.dataclass(frozen=True)
    class Planted:
        depth: int = flag("--depth", type=int, default=3, help=text)

    with pytest.raises(DeclarationError, match="states a default itself"):
        parse(Planted)


def test_the_help_says_the_declared_default_where_it_is_written():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Declared:
        steps_word: ClassVar[str] = "steps"
        depth: int = flag("--depth", type=int, default=3, help="layers ({default}); deeper")
        width: float = flag("--width", type=float, default=0.5, help="a fraction")
        mode: str | None = flag("--mode", default=None, shown="as {steps_word}", help="how")
        rules: str = flag(help="a rules file, or 'default' for lockstep's")

    helps = {a.dest: a.help for a in parse(Declared)._actions}
    assert helps["depth"] == "layers (default 3); deeper"
    assert helps["width"] == "a fraction (default 0.5)"
    assert helps["mode"] == "how (default: as steps)"
    assert helps["rules"] == "a rules file, or 'default' for lockstep's"


@pytest.mark.parametrize("path", list(LEAVES), ids=" ".join)
def test_every_command_is_one_declaration(path):
    """Each command's parser was made from one options class, and every flag it takes is a
    field of that class (or of a class it nests) with help."""
    parser = LEAVES[path]
    options = parser.get_default("options_class")
    assert dataclasses.is_dataclass(options), f"lockstep {' '.join(path)} is not declared"
    fields = {f.name for f, _, _ in flags._declared(options)}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.dest in fields and action.help, (path, action.dest)
        literal = action.default not in (None, False, []) and "default:" not in action.help
        if literal:  # a default a user would type is stated as the declaration has it
            shown = f"{action.default:g}" if isinstance(action.default, float) else action.default
            assert f"default {shown}" in action.help, (path, action.dest, action.help)


def test_the_shared_job_options_have_one_default_everywhere():
    for path in [("check",), ("gate", "record"), ("gate", "check"), ("gate", "ab"), ("train",)]:
        actions = {a.dest: a for a in LEAVES[path]._actions}
        assert actions["nproc"].default == job_options.NPROC == 2
        assert actions["timeout"].default == job_options.TIMEOUT_S == 1800.0
    assert "8 with --script" in {a.dest: a.help for a in LEAVES[("check",)]._actions}["steps"]
    gate_steps = {a.dest: a.help for a in LEAVES[("gate", "check")]._actions}["steps"]
    assert "20 with --script" in gate_steps


def test_check_help_states_the_script_tolerances_of_the_registry():
    rtol = {a.dest: a.help for a in LEAVES[("check",)]._actions}["rtol"]
    assert "0 for determinism, resume, world-size" in rtol
    assert "replicas always compares exactly" in rtol


def test_parsed_options_become_a_frozen_object():
    from lockstep.gate.options import GateRun

    args = build_parser().parse_args(
        ["gate", "check", "g", "--script", "t.py", "--set", "a=1", "--steps", "4", "--run-path"]
    )
    run = flags.read(GateRun, args, command="check")
    assert run.job.job == job_options.JobOptions(
        script="t.py", overrides=("a=1",), steps=4, run_path=True
    )
    assert (run.name, run.repeats, run.reports.plot) == ("g", 3, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.job.nproc = 1  # type: ignore[misc]


@pytest.mark.parametrize("package", ["checks", "gate", "train", "env", "forensics"])
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
