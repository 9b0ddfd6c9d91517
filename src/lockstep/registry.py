"""Tables of behaviours by name (`Registry`), and `Ref`: a function or class named as
'module:attr', imported at its first use, so that a table is read without torch."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from lockstep.errors import UsageError

Row = TypeVar("Row")


class UnknownName(UsageError, KeyError):
    """A name no row has (a KeyError, as a dict's)."""

    __str__ = Exception.__str__  # KeyError's would quote the one-line message


class Registry(dict[str, Row]):
    """Rows by their `name` in registration order; `table[name]` of an unknown name is
    `UnknownName`, naming the known ones. `kind` names a row in errors."""

    def __init__(self, kind: str, rows: Iterable[Row] = ()):
        super().__init__()
        self.kind = kind
        for row in rows:
            self.register(row)

    def register(self, row: Row, *, replace: bool = False) -> Row:
        """Add `row` last; a name taken is an error unless `replace` (then it takes that place)."""
        if row.name in self and not replace:
            raise ValueError(
                f"{self.kind} '{row.name}' is already registered; register(..., replace=True) "
                "replaces it"
            )
        self[row.name] = row
        return row

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def __missing__(self, name: str):
        raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self) or 'none'}")


@dataclass(frozen=True)
class Ref:
    """'module:attr'; picklable (a launch sends its rank functions to the ranks)."""

    target: str

    @property
    def path(self) -> str:
        return self.target.partition(":")[0]

    def resolve(self):
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)
