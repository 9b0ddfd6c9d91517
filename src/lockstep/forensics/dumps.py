"""Reading flight-recorder dumps back: a restricted unpickler (a dump is a pickle of builtins
only; anything naming a class or function is refused) and a folder of dumps, one a rank.

Formats read: torch's `_dump_fr_trace()` / `TORCH_FR_DUMP_TEMP_FILE` pickles, versions
"2.x" (2.10 in torch 2.13; older ones lack `pg_status`, which `analysis` then infers from
each entry's `state`), and their JSON form (`_dump_nccl_trace_json`).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 512 * 1024 * 1024


class DumpError(ValueError):
    """A file that is not a flight-recorder dump lockstep can read."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise DumpError(f"refused: the dump names {module}.{name} (a dump holds only builtins)")


def loads(data: bytes) -> dict:
    """A dump's dict, read without running any code the pickle names."""
    if data[:1] in (b"{", b"["):
        try:
            obj = json.loads(data)
        except ValueError as err:
            raise DumpError(f"not a dump: {err}") from None
    else:
        try:
            obj = _Restricted(io.BytesIO(data)).load()
        except DumpError:
            raise
        except Exception as err:
            raise DumpError(f"not a dump: {type(err).__name__}: {err}") from None
    if not isinstance(obj, dict) or "entries" not in obj:
        raise DumpError("not a flight-recorder dump (no 'entries')")
    return obj


@dataclass
class Dump:
    rank: int
    data: dict
    stacks: str | None = None

    @property
    def version(self) -> str:
        return str(self.data.get("version", "unknown"))


RANK = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")


def load_dir(folder: Path) -> tuple[dict[int, Dump], list[str]]:
    """Every dump in `folder` by rank (the number ending its name: `rank_3`,
    `nccl_trace_rank_3`, `fr_3.pkl`), and one line for each file that could not be read."""
    dumps: dict[int, Dump] = {}
    problems: list[str] = []
    for path in sorted(Path(folder).iterdir()):
        match = RANK.search(path.name)
        if not path.is_file() or path.name.startswith(".") or not match:
            continue
        if path.stat().st_size > MAX_BYTES:
            problems.append(f"{path.name}: over {MAX_BYTES} bytes, skipped")
            continue
        try:
            data = loads(path.read_bytes())
        except DumpError as err:
            problems.append(f"{path.name}: {err}")
            continue
        rank = int(match.group(1))
        stacks = path.with_name(path.name + ".stacks")
        text = stacks.read_text(errors="replace") if stacks.is_file() else None
        dumps[rank] = Dump(rank, data, text)
    return dumps, problems
