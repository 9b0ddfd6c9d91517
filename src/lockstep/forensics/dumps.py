"""Reading flight-recorder dumps back within `bounds` (a pickle or its JSON form, a file a
rank), checked so that no dump makes the analysis raise.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lockstep.forensics import unpickle
from lockstep.forensics.bounds import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_DTYPE,
    MAX_FILES,
    MAX_RANKS,
    MAX_SEQ,
    MAX_SIZES,
    MAX_STACKS,
    NAME_COST,
    Budget,
    DumpError,
    OutOfBounds,
    json_cost,
    read_regular,
    shown,
)

__all__ = ["Dump", "DumpError", "OutOfBounds", "checked", "load_dir", "loads"]


def loads(data: bytes, budget: Budget | None = None) -> dict:
    """A dump's dict within `budget`: DumpError for a file that is not a dump, OutOfBounds for
    one past a bound."""
    budget = Budget() if budget is None else budget
    if data[:1] in (b"{", b"["):
        budget.charge(json_cost(data))
        try:
            obj = json.loads(data)
        except RecursionError:
            raise OutOfBounds(f"JSON nested over {MAX_DEPTH} deep") from None
        except ValueError as err:
            raise DumpError(f"not a dump: {err}") from None
        _json_depth(obj)
    else:
        obj = unpickle.load(data, budget)
    return checked(obj, budget.clock)


def _json_depth(obj) -> None:
    """OutOfBounds when `obj` (from JSON: a tree) nests over MAX_DEPTH containers."""
    level, depth = [obj], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise OutOfBounds(f"JSON nested over {MAX_DEPTH} deep")
        level = [c for o in level for c in (o.values() if isinstance(o, dict) else o)
                 if isinstance(c, dict | list)]  # fmt: skip


def checked(obj, clock: Callable[[], None] = lambda: None) -> dict:
    """`obj` if the fields `analysis` uses have torch's types (numbers made ints), else
    DumpError or OutOfBounds naming the field."""
    if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
        raise DumpError("not a flight-recorder dump (no 'entries' list)")
    if not isinstance(obj.get("version", ""), str | int | float):
        raise DumpError("not a dump: its version is not a string")
    for i, e in enumerate(obj["entries"]):
        clock()
        _entry(e, i)
    status = _mapping(obj, "pg_status", "pg_status")
    for name, st in status.items():
        clock()
        where = f"pg_status[{shown(name)[:80]}]"
        if not isinstance(st, dict):
            raise DumpError(f"not a dump: {where} is not a dict")
        for key in ("last_enqueued_collective", "last_started_collective",
                    "last_completed_collective"):  # fmt: skip
            if key in st:
                st[key] = _number(st[key], f"{where}'s {key}", lowest=-1)
    for name, config in _mapping(obj, "pg_config", "pg_config").items():
        clock()
        if isinstance(config, dict):
            config["ranks"] = _ranks(config.get("ranks"), f"pg_config[{shown(name)[:80]}]")
            if not isinstance(config.get("desc", ""), str):
                raise DumpError(f"not a dump: pg_config[{shown(name)[:80]}]'s desc")
    return obj


_TYPES = {  # an entry's fields the analysis reads, and what each may be besides None
    "pg_id": (int, str), "profiling_name": (str,), "state": (str,), "is_p2p": (bool, int),
    "input_dtypes": (list,), "output_dtypes": (list,),
    "input_sizes": (list,), "output_sizes": (list,), "process_group": (list, tuple),
}  # fmt: skip


def _entry(e, i: int) -> None:
    if not isinstance(e, dict):
        raise DumpError(f"not a dump: entry {i} is not a dict")
    for key, types in _TYPES.items():
        value = e.get(key)
        if value is not None and not isinstance(value, types):
            raise DumpError(f"not a dump: entry {i}'s {key} is a {type(value).__name__}")
    if e.get("collective_seq_id") is not None:
        e["collective_seq_id"] = _number(e["collective_seq_id"], f"entry {i}'s collective_seq_id")
    pg = e.get("process_group")
    if pg is not None and not (1 <= len(pg) <= 2 and all(isinstance(p, str) for p in pg)):
        raise DumpError(f"not a dump: entry {i}'s process_group is not (name, desc)")
    for key in ("input_dtypes", "output_dtypes"):
        names = e.get(key) or ()
        if len(names) > MAX_SIZES:
            raise OutOfBounds(f"entry {i}'s {key}: over {MAX_SIZES} of them")
        if not all(isinstance(d, str) for d in names):
            raise DumpError(f"not a dump: entry {i}'s {key} are not strings")
        if any(len(d) > MAX_DTYPE for d in names):
            raise OutOfBounds(f"entry {i}'s {key}: a name over {MAX_DTYPE} characters")
    for key in ("input_sizes", "output_sizes"):
        held = 0  # the lists may be one list many times over: counted before walked
        for size in e.get(key) or ():
            held += 1 + (len(size) if isinstance(size, list) else 0)
            if held > MAX_SIZES:
                raise OutOfBounds(f"entry {i}'s {key} hold over {MAX_SIZES} numbers")
            if not isinstance(size, list) or not all(type(n) is int for n in size):
                raise DumpError(f"not a dump: entry {i}'s {key} are not lists of integers")


def _mapping(obj: dict, key: str, where: str) -> dict:
    """`obj[key]`: a dict of process groups by name (a string: the analysis prints it)."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(type(name) is str for name in value):
        raise DumpError(f"not a dump: {where} is not a dict by name")
    return value


def _number(value, where: str, lowest: int = 0) -> int:
    """`value` (an int, or a string of digits in JSON dumps) as an int in torch's int64."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value):
        value = int(value)
    if type(value) is not int:
        raise DumpError(f"not a dump: {where} is not an integer")
    if not lowest <= value <= MAX_SEQ:
        raise OutOfBounds(f"{where} {value} outside {lowest}..{MAX_SEQ} (torch's int64)")
    return value


def _ranks(raw, where: str) -> list[int]:
    """A process group's ranks: torch writes them as a string, "[0, 1, 2]"."""
    if raw is None:
        return []
    if isinstance(raw, str):
        if not re.fullmatch(r"\[[\d,\s]*\]", raw):
            raise DumpError(f"not a dump: {where}'s ranks are not a list of numbers")
        if raw.count(",") >= MAX_RANKS:
            raise OutOfBounds(f"{where} names over {MAX_RANKS} ranks")
        digits = re.findall(r"\d+", raw)
        if any(len(d) > 7 for d in digits):  # int() of thousands of digits raises
            raise OutOfBounds(f"{where} names a rank outside 0..{MAX_RANKS - 1}")
        raw = [int(d) for d in digits]
    if not isinstance(raw, list) or not all(type(r) is int for r in raw):
        raise DumpError(f"not a dump: {where}'s ranks are not a list of numbers")
    if len(raw) > MAX_RANKS or any(not 0 <= r < MAX_RANKS for r in raw):
        raise OutOfBounds(f"{where} names a rank outside 0..{MAX_RANKS - 1}")
    return raw


@dataclass
class Dump:
    rank: int
    data: dict
    stacks: str | None = None

    @property
    def version(self) -> str:
        return str(self.data.get("version", "unknown"))


RANK = re.compile(r"(?<!\d)(\d+)(?:\.(?:pkl|pickle|json))?$")


def load_dir(folder: Path, budget: Budget | None = None,
             strict: bool = False) -> tuple[dict[int, Dump], list[str]]:  # fmt: skip
    """Every dump in `folder` by rank (the number ending its name), and a line for each file
    not read; `strict`: OutOfBounds past a bound."""
    budget = Budget() if budget is None else budget
    dumps: dict[int, Dump] = {}
    problems: list[str] = []
    try:
        paths = _listed(Path(folder), budget)
    except OutOfBounds as err:
        if strict:
            raise
        return dumps, [str(err)]
    for path in paths:
        match = RANK.search(path.name)
        if path.name.startswith(".") or not match:
            continue
        where = shown(path.name)
        try:
            rank = _rank(match.group(1))
            data = loads(read_regular(path, MAX_BYTES, budget), budget)
            where = shown(f"{path.name}.stacks")
            try:
                text = read_stacks(path.with_name(f"{path.name}.stacks"), budget)
            except FileNotFoundError:
                text = None
        except OutOfBounds as err:
            if strict:
                raise OutOfBounds(f"{where}: {err}") from None
            problems.append(f"{where}: {err}")
            continue
        except DumpError as err:
            problems.append(f"{where}: {err}")
            continue
        except OSError as err:
            problems.append(f"{where}: {err.strerror or type(err).__name__}")
            continue
        dumps[rank] = Dump(rank, data, text)
    return dumps, problems


def _listed(folder: Path, budget: Budget) -> list[Path]:
    """The names in `folder`, sorted; OutOfBounds past MAX_FILES of them."""
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > MAX_FILES:
                raise OutOfBounds(f"over {MAX_FILES} files in the folder")
    budget.charge(NAME_COST * len(names))
    return [folder / name for name in sorted(names)]


def _rank(digits: str) -> int:
    if len(digits) > 7 or int(digits) >= MAX_RANKS:
        raise OutOfBounds(f"rank {digits[:20]} outside 0..{MAX_RANKS - 1}")
    return int(digits)


def read_stacks(path: Path, budget: Budget) -> str:
    """The first MAX_STACKS bytes of a rank's `.stacks`, charged."""
    data = read_regular(path, MAX_STACKS, budget, cut=True)
    budget.charge(len(data))  # decoded: as much again
    return data.decode(errors="replace")
