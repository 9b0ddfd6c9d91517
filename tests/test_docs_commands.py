"""Every `lockstep ...` command line in README.md and docs/*.md goes through the CLI's parser.

Documentation cannot name a command or a flag that no longer exists: each command line of a
fenced shell block (continuations with `\\` joined, pipes, `&&` and `;` split, launchers such as
`torchrun ... -m lockstep` or `srun ... lockstep` followed) and each inline code span that
starts with `lockstep ` is parsed in-process by `lockstep.cli.build_parser()`. Placeholders
(`FILE`, `N`, `<env-key>`, `$HEAD`, `[--set k=v]`, a trailing `...`) get plausible values. A
span that only names a command (`lockstep gate refresh`) may leave its positionals out, but
every flag it shows must still exist, spelled in full.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockstep.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "recipes").glob("*.md")),
]

# Fenced blocks in these languages hold no shell command lines.
NOT_SHELL = {"python", "py", "toml", "json", "jsonl", "yaml", "yml", "ini", "xml", "text", "hcl"}
LAUNCHERS = {"torchrun", "srun", "mpirun", "deepspeed", "sudo", "env", "timeout", "time"}
SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # FILE, N, PATH, CONFIG, NAME ...
NUMERIC = {"N", "M", "K", "R", "S", "GBPS", "STEPS", "ROUNDS"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
INLINE = re.compile(r"(?<!`)`(lockstep [^`]+)`(?!`)")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as the document shows it


def _fenced_and_prose(text: str) -> tuple[list[tuple[int, str, str]], str]:
    """([(line number, language, line), ...] of fenced blocks, the prose with blocks blanked)."""
    fenced, prose, fence, lang = [], [], None, ""
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence, lang = m.group(2), m.group(3).lower()
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            prose.append("")
        elif fence is not None:
            fenced.append((number, lang, line))
            prose.append("")
        else:
            prose.append(line)
    return fenced, "\n".join(prose)


def extract(text: str, name: str) -> list[Command]:
    """The `lockstep` command lines a Markdown document shows."""
    found = []
    fenced, prose = _fenced_and_prose(text)
    pending, start = "", 0
    for number, lang, line in fenced:
        if lang in NOT_SHELL:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined, pending = pending + line, ""
        for segment in _segments(joined):
            if _lockstep_argv(segment) is not None:
                found.append(Command(f"{name}:{start}", shlex.join(segment)))
    for m in INLINE.finditer(prose):
        line = prose.count("\n", 0, m.start()) + 1
        found.append(Command(f"{name}:{line}", " ".join(m.group(1).split())))
    return found


def _segments(line: str) -> list[list[str]]:
    """Shell words of each simple command on the line; comments dropped."""
    line = re.sub(r"<[^<>\n]+>", "x", line)  # <env-key>, <sha256 ...>
    line = re.sub(r"\$\{?\w+\}?", "x", line)  # $HEAD, ${VAR}
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: not a command line
        return []
    segments, current = [], []
    for word in words:
        if word in SEPARATORS or word.endswith(">") or word.startswith(">"):
            segments.append(current)
            current = []
        else:
            current.append(word)
    segments.append(current)
    return [s for s in segments if s]


def _lockstep_argv(words: list[str]) -> list[str] | None:
    """What follows `lockstep` when the words run it (directly, with -m, or under a launcher)."""
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1  # NAME=value before the command
    words = words[i:]
    for i, word in enumerate(words):
        if word != "lockstep" and not word.endswith("/bin/lockstep"):
            continue
        if i == 0 or words[i - 1] in ("-m", "--module") or words[0] in LAUNCHERS:
            return words[i + 1 :]
        return None
    return None


def argv_of(command: str) -> list[str]:
    """The argument list a command line gives lockstep, placeholders filled in."""
    words = [w.lstrip("[").rstrip("]") for w in shlex.split(command)]  # `[--set k=v]`
    words = [w for w in words if w]
    argv = _lockstep_argv(words)
    assert argv is not None, f"not a lockstep command: {command}"
    out: list[str] = []
    for word in argv:
        if word in ("...", "…"):
            if out and out[-1].startswith("-"):
                out.append("x")  # `--script ...`: some value
            continue  # `lockstep gate ab ...`: more of the same, left out
        if PLACEHOLDER.match(word):
            word = "2" if word in NUMERIC else "all" if word == "NAME" else "x"
        out.append(word)
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _command_parser(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)command's parser, and the words after the command's name."""
    rest = list(argv)
    while rest and rest[0] in _subparsers(parser):
        parser = _subparsers(parser)[rest.pop(0)]
    return parser, rest


def _takes_value(parser: argparse.ArgumentParser, word: str) -> bool:
    action = parser._option_string_actions.get(word)
    return action is not None and action.nargs != 0


def unknown_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Flags the (sub)command does not have, spelled exactly (no abbreviations)."""
    parser, rest = _command_parser(parser, argv)
    known = parser._option_string_actions
    bad, takes_value = [], False
    for word in rest:
        if takes_value:  # the value of the flag before, whatever it looks like
            takes_value = False
            continue
        if not word.startswith("-") or re.match(r"^-\d", word):
            continue
        flag, eq, _ = word.partition("=")
        if flag not in known:
            bad.append(word)
        else:
            takes_value = not eq and _takes_value(parser, flag)
    return bad


def problem(parser: argparse.ArgumentParser, command: str) -> str | None:
    """None when the parser takes the command line; else what it said."""
    argv = argv_of(command)
    bad = unknown_flags(parser, argv)
    if bad:
        return f"no such flag: {', '.join(bad)}"
    if argv and _takes_value(_command_parser(parser, argv)[0], argv[-1]):
        argv.append("x")  # `lockstep check --script` names a flag: give it a value
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                said = err.getvalue().strip()
                # a span that names a command without its positionals: the flags were checked
                if "the following arguments are required" not in said:
                    return said or f"exit {exit_.code}"
    return None


def _all_commands() -> list[Command]:
    found = []
    for path in DOCS:
        found += extract(path.read_text(), str(path.relative_to(ROOT)))
    return found


COMMANDS = _all_commands()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} {c.text[:60]}")
def test_documented_command_parses(parser, command):
    assert problem(parser, command.text) is None, (
        f"{command.where}: `{command.text}`: {problem(parser, command.text)}"
    )


def test_every_command_is_documented(parser):
    """The docs show each command and gate subcommand at least once."""
    shown = {tuple(argv_of(c.text)[:2]) for c in COMMANDS}
    for name, sub in _subparsers(parser).items():
        subs = _subparsers(sub)
        if subs:
            missing = [s for s in subs if (name, s) not in shown]
            assert not missing, f"lockstep {name} {missing} appear in no document"
        else:
            assert any(s[:1] == (name,) for s in shown), f"lockstep {name} appears in no document"


def test_a_stale_flag_is_caught(parser):
    doc = (
        "Run it:\n\n```bash\nlockstep preflight --no-such-flag\n"
        "torchrun --nproc-per-node 8 -m lockstep preflight --min-busbw 50 --gone 1\n```\n\n"
        "or `lockstep check --bogus` and `lockstep gate nope`.\n"
    )
    commands = extract(doc, "fake.md")
    assert [c.text for c in commands] == [
        "lockstep preflight --no-such-flag",
        "torchrun --nproc-per-node 8 -m lockstep preflight --min-busbw 50 --gone 1",
        "lockstep check --bogus",
        "lockstep gate nope",
    ]
    assert all(problem(parser, c.text) for c in commands), [
        (c.text, problem(parser, c.text)) for c in commands
    ]


def test_placeholders_and_shell_forms_parse(parser):
    doc = (
        "```bash\n"
        "srun --ntasks-per-node 8 lockstep preflight --lock FILE \\\n"
        "    --json $OUT/p.json && lockstep diff a.json <other>.json | tee d.txt  # a comment\n"
        "LOCKSTEP_REDACT_KEY=k python -m lockstep fingerprint --json fp.json\n"
        "deepspeed --num_gpus 8 --module lockstep preflight\n"
        "lockstep check NAME CONFIG [--nproc N] [--set k=v] [--json PATH]\n"
        "pip install lockstep   # not a lockstep command\n"
        "```\n\n"
        "A span that names a command: `lockstep gate refresh`, `lockstep gate ab --script ...\n"
        "--base origin/main`.\n"
    )
    commands = extract(doc, "fake.md")
    assert len(commands) == 7, [c.text for c in commands]
    assert [problem(parser, c.text) for c in commands] == [None] * 7


def test_docs_show_commands():
    assert len(COMMANDS) > 30, "the extraction found almost nothing: is the Markdown parsed?"


def test_the_protocol_example_is_the_tested_script():
    """docs/scripts.md shows examples/train_protocol.py verbatim (tests/checks run that file)."""
    example = (ROOT / "examples" / "train_protocol.py").read_text()
    fenced, _ = _fenced_and_prose((ROOT / "docs" / "scripts.md").read_text())
    blocks: dict[int, list[str]] = {}
    previous = None
    for number, lang, line in fenced:
        if lang == "python":
            start = number if previous != number - 1 else max(blocks, default=number)
            blocks.setdefault(start, []).append(line)
            previous = number
    shown = ["\n".join(lines) + "\n" for lines in blocks.values()]
    assert example in shown, "docs/scripts.md no longer shows examples/train_protocol.py as it is"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a document's headings."""
    _, prose = _fenced_and_prose(text)
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def test_relative_links_resolve():
    """Every relative link of README.md and docs/ names a file that exists (and its heading)."""
    broken = []
    for path in DOCS:
        _, prose = _fenced_and_prose(path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
