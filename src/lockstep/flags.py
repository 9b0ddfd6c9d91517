"""A command's options declared once, as a frozen dataclass whose `flag(...)` fields carry flag,
type, help and the one default; from it come the parser (`add`), the options object (`read`)
and a rank's argv (`argv`). Design: docs/design/options.md."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass
from typing import Any

# the word, not a quoted value such as 'default'
_STATED_DEFAULT = re.compile(r"(?<!['\"])\bdefault(?!['\"])", re.IGNORECASE)


class DeclarationError(TypeError):
    """A declaration lockstep's own code got wrong (not a user's input)."""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # ("--nproc",); () for a positional argument named by its field
    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: Callable[[], Iterable[str]] | tuple[str, ...] | None = None
    # the default in words where the value does not say it; may name class attributes
    shown: str | Callable[[], str] | None = None
    negatable: bool = False  # --x / --no-x, None when neither is given
    to_ranks: bool = False  # passed on to the ranks a command starts itself (`argv`)
    group: str | None = None  # the title of the help section it is listed under
    order: int = 0  # positionals are taken in this order, then in declaration order


def flag(*names: str, help: str, default: Any = MISSING, **how: Any) -> Any:
    """A dataclass field that is also a command-line option (`Flag` for `how`)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(names, help, **how)})


def nested(options: type, *, exclude: tuple[str, ...] = ()) -> Any:
    """A field holding another declared options class, whose flags (less `exclude`) join."""
    return dataclasses.field(default_factory=options, metadata={"nested": (options, exclude)})


def _declared(cls: type, exclude: tuple[str, ...] = ()):
    """(field, Flag, owner) of every flag of `cls` and of the classes it nests, in order."""
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        if "nested" in field.metadata:
            inner, inner_exclude = field.metadata["nested"]
            yield from _declared(inner, inner_exclude)
        elif "flag" in field.metadata:
            yield field, field.metadata["flag"], cls


def _default(field: dataclasses.Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class _Names(dict):
    """The names a help text may use: `{default}` and the class's attributes."""

    def __init__(self, owner: type, **names: str):
        super().__init__(names)
        self.owner = owner

    def __missing__(self, name: str) -> Any:
        return getattr(self.owner, name)


def help_text(field: dataclasses.Field, flag: Flag, owner: type) -> str:
    """The help a user reads: the declared text and the declared default, nothing else."""
    where = f"{owner.__name__}.{field.name}"
    if not flag.help.strip():
        raise DeclarationError(f"{where}: a flag without help")
    if _STATED_DEFAULT.search(flag.help.replace("{default}", "")):
        raise DeclarationError(
            f"{where}: its help states a default itself; declare it (default=, shown=) and "
            "write {default} where it goes"
        )
    value = _default(field)
    if flag.shown is not None:
        words = flag.shown() if callable(flag.shown) else flag.shown
        words = words.format_map(_Names(owner))
        default = ("default: " if " " in words else "default ") + words
    elif value in (MISSING, None, False, ()):
        default = ""
    else:
        default = f"default {_shown(value)}"
    text = flag.help.format_map(_Names(owner, default=default))
    if default and "{default}" not in flag.help:
        text = f"{text} ({default})"
    return text.replace("%", "%%")


def add(parser, options: type, *, exclude: tuple[str, ...] = ()) -> None:
    """Add `options`' flags (and those of the classes it nests) to an argparse parser."""
    import argparse

    groups: dict[str, Any] = {}
    declared = list(_declared(options, exclude))
    positional = sorted(
        (i for i, (_, flag, _) in enumerate(declared) if not flag.names),
        key=lambda i: declared[i][1].order,
    )
    for i in [*positional, *(i for i, (_, flag, _) in enumerate(declared) if flag.names)]:
        field, flag, owner = declared[i]
        value = _default(field)
        kwargs: dict[str, Any] = {"help": help_text(field, flag, owner)}
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        if flag.choices is not None:
            kwargs["choices"] = list(flag.choices() if callable(flag.choices) else flag.choices)
        if flag.negatable:
            kwargs.update(action=argparse.BooleanOptionalAction, default=value)
        elif value is False:
            kwargs.update(action="store_true")
        elif isinstance(value, tuple):
            kwargs.update(action="append", default=[], type=flag.type)
        else:
            kwargs["type"] = flag.type
            if not flag.names and value is not MISSING:
                kwargs.update(nargs="?", default=value)
            elif flag.names and value is MISSING:
                kwargs["required"] = True
            elif flag.names:
                kwargs["default"] = value
        if not flag.names:
            parser.add_argument(field.name, **kwargs)
            continue
        if flag.group is not None and flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        target = parser if flag.group is None else groups[flag.group]
        target.add_argument(*flag.names, dest=field.name, **kwargs)
    parser.set_defaults(options_class=options)


def read(options: type, namespace: Any, **given: Any) -> Any:
    """The options object of a parsed namespace; `given` sets fields that are no flags."""
    values = dict(given)
    for field in dataclasses.fields(options):
        if field.name in values:
            continue
        if "nested" in field.metadata:
            values[field.name] = read(field.metadata["nested"][0], namespace)
        elif "flag" in field.metadata and hasattr(namespace, field.name):
            value = getattr(namespace, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return options(**values)


def argv(options: Any) -> list[str]:
    """The `to_ranks` flags that differ from their defaults, as argv that `read` reads back."""
    out: list[str] = []
    for field, flag, _ in _declared(type(options)):
        value = getattr(options, field.name)
        if not flag.to_ranks or value == _default(field):
            continue
        name = flag.names[0]
        if flag.negatable:
            out.append(name if value else "--no-" + name.removeprefix("--"))
        elif value is True:
            out.append(name)
        elif isinstance(value, tuple):
            for item in value:
                out += [name, str(item)]
        else:
            out += [name, str(value)]
    return out


def command(subparsers, name: str, options: type, run: Callable[[Any], int] | str, *,
            exclude: tuple[str, ...] = (), given: dict | None = None, **parser_args):  # fmt: skip
    """A subcommand: `options`' flags, then `run(options)`; a "module:function" `run` is
    imported only when the command runs, so that help stays fast."""
    parser = subparsers.add_parser(name, **parser_args)
    add(parser, options, exclude=exclude)

    def func(args) -> int:
        work = run
        if isinstance(work, str):
            module, _, attr = work.partition(":")
            work = getattr(importlib.import_module(module), attr)
        return work(read(options, args, **(given or {})))

    parser.set_defaults(func=func)
    return parser
