"""Dumps crafted to blow up a reader through the pickle's memo (a DAG: one container referenced
many times), written in opcodes as torch's pickler writes them (protocol 2, BINPUT/BINGET).
`python tests/forensics/crafted.py` remakes the fixtures under data/crafted/; the tests build
the larger ones they need (`colliding_keys`, `many_dicts`) in a tmp folder.

- dag-dict: a tuple of 4 references to a tuple of 4 ..., 17 deep (4**17 leaves), a dict's key:
  its hash took 10**10 steps inside one C call (about 300 bytes);
- dag-set: the same DAG as a frozenset's member;
- shared-sizes: two dumps whose entry's input_sizes are one list of 4000 numbers, 12000 times
  (32 KB each: 48M numbers in the `json.dumps` of the analysis);
- wide-sizes: an entry's input_sizes, one list of 2000 numbers 2000 times: within the memory
  budget, past the numbers an entry may hold;
- shared-entries: two dumps whose entries are one entry 8000 times, its sizes 8000 numbers.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "crafted"


def text(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def number(n: int) -> bytes:
    return b"K" + bytes([n]) if 0 <= n < 256 else b"J" + struct.pack("<i", n)


def put(i: int) -> bytes:
    return b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)


def get(i: int) -> bytes:
    return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)


def dump(entries: bytes, prelude: bytes = b"", extra: bytes = b"", proto: int = 2) -> bytes:
    """A dump's dict, `prelude` first (memoized objects, popped), `entries` its entries' items
    (between a MARK and APPENDS), `extra` more key/value pairs: one process group, whose
    #1 is pending."""
    status = text("0") + b"}(" + text("last_enqueued_collective") + number(1)
    status += text("last_completed_collective") + number(0) + b"u"
    return (b"\x80" + bytes([proto]) + prelude + b"}(" + text("version") + text("2.10")
            + text("pg_status") + b"}(" + status + b"u" + text("entries") + b"](" + entries
            + b"e" + extra + b"u.")  # fmt: skip


def entry(sizes: bytes) -> bytes:
    """An all_reduce #1 whose input_sizes are `sizes` (a list's opcodes)."""
    return (b"}(" + text("collective_seq_id") + number(1) + text("profiling_name")
            + text("gloo:all_reduce") + text("input_sizes") + sizes + b"u")  # fmt: skip


def dag(levels: int = 17, width: int = 4) -> tuple[bytes, int]:
    """Opcodes memoizing t0 = (), t(i+1) = (t(i),) * width; the memo index of the last."""
    out = b")" + put(0) + b"0"
    for i in range(1, levels + 1):
        out += b"(" + get(i - 1) * width + b"t" + put(i) + b"0"
    return out, levels


def dag_key(levels: int = 17) -> bytes:
    prelude, top = dag(levels)
    return dump(b"", prelude, get(top) + number(1))


def dag_member(levels: int = 17) -> bytes:
    prelude, top = dag(levels)
    return dump(b"", prelude, text("x") + b"(" + get(top) + b"\x91", proto=4)


def one_list(n: int) -> bytes:
    """Memo 0: a list of `n` numbers (0..255 over and over), popped."""
    return b"]" + put(0) + b"(" + b"".join(number(i % 256) for i in range(n)) + b"e0"


def shared_sizes(n: int = 4000, refs: int = 12000) -> bytes:
    return dump(entry(b"](" + get(0) * refs + b"e"), one_list(n))


def shared_entries(n: int = 8000, refs: int = 8000) -> bytes:
    prelude = one_list(n) + entry(b"](" + get(0) + b"e") + put(1) + b"0"
    return dump(get(1) * refs, prelude)


def colliding_keys(n: int) -> bytes:
    """A dump with a dict of `n` integer keys whose hashes are all 0 (multiples of 2**61 - 1,
    the modulus of CPython's int hash): each insertion walks the ones before."""
    keys = b"".join(b"\x8a\x10" + (i * (2**61 - 1)).to_bytes(16, "little") + b"N"
                    for i in range(1, n + 1))  # fmt: skip
    return dump(b"", extra=text("x") + b"}(" + keys + b"u")


def many_dicts(n: int) -> bytes:
    """A dump holding `n` empty dicts (one byte each in the pickle, 64 in memory)."""
    return dump(b"", extra=text("x") + b"(" + b"}" * n + b"l")


FIXTURES = {
    "dag-dict": {"rank_0": dag_key},
    "dag-set": {"rank_0": dag_member},
    "shared-sizes": {"rank_0": shared_sizes, "rank_1": shared_sizes},
    "wide-sizes": {"rank_0": lambda: shared_sizes(2000, 2000)},
    "shared-entries": {"rank_0": shared_entries, "rank_1": shared_entries},
}


def main() -> None:
    for case, files in FIXTURES.items():
        (DATA / case).mkdir(parents=True, exist_ok=True)
        for name, make in files.items():
            (DATA / case / name).write_bytes(make())
            print(f"{DATA / case / name}: {len(make())} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
