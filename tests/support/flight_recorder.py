"""Flight-recorder dumps as torch 2.13 writes them (`_dump_fr_trace()` on gloo ranks), and dumps
crafted past the reader's bounds (`lockstep.forensics.bounds`)."""

from __future__ import annotations

import pickle
import struct


def entry(seq: int, op: str, size=(4,), dtype="Float", pg=("0", "default_pg"), out=None):
    return {
        "record_id": seq - 1, "pg_id": 0, "process_group": pg, "thread_name": "python",
        "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": f"gloo:{op}", "time_created_ns": seq, "input_sizes": [list(size)],
        "input_dtypes": [dtype], "output_sizes": [list(out or size)], "output_dtypes": [dtype],
        "state": "scheduled", "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True, "timeout_ms": 1800000,
        "is_p2p": False, "frames": [{"name": "all_reduce", "filename": "c10d.py", "line": 1}],
    }  # fmt: skip


def dump(world: int, ops: list, completed: int | None = None, version="2.10") -> dict:
    """A rank's dump: `ops` its collectives in order (an op name or an entry), the last one
    pending unless `completed` says otherwise."""
    entries = [o if isinstance(o, dict) else entry(i, o) for i, o in enumerate(ops, 1)]
    done = len(ops) - 1 if completed is None else completed
    return {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "comm_lib_version": "",
        "pg_status": {
            "0": {
                "last_enqueued_collective": len(ops),
                "last_started_collective": -1,
                "last_completed_collective": done,
            }
        },
        "entries": entries,
    }


def pickled(d: dict) -> bytes:
    return pickle.dumps(d)


# ------------------------------------------------- crafted dumps past the reader's bounds


def memo_pickle(index: int, text: bool = False) -> bytes:
    """A tiny pickle storing an empty dict at memo `index`: LONG_BINPUT (4 bytes: 9 bytes in
    all with protocol 2), after a BINPUT 0; or the text PUT of protocol 0. The C unpickler
    makes its memo an array as long as the index (16 bytes an index: 1 GiB for 2**26)."""
    if text:
        return b"}p%d\n." % index
    return b"\x80\x02}q\x00r" + struct.pack("<I", index) + b"."


def far_apart(op: str = "all_reduce", seq: int = 10**15) -> bytes:
    """A dump of two collectives, #1 and #`seq`, the last one pending (about 200 bytes)."""
    d = {
        "version": "2.10",
        "pg_status": {"0": {"last_enqueued_collective": seq, "last_completed_collective": seq - 1}},
        "entries": [{"collective_seq_id": 1, "profiling_name": "gloo:all_reduce"},
                    {"collective_seq_id": seq, "profiling_name": f"gloo:{op}"}],
    }  # fmt: skip
    return pickle.dumps(d)


def nested_pickle(depth: int) -> bytes:
    """A dump whose one entry's input_sizes are `depth` lists, one in the other (spliced in
    opcodes: pickle.dumps would recurse that deep)."""
    head = pickle.dumps({"entries": [{"collective_seq_id": 1, "input_sizes": 0}]}, protocol=2)
    assert head.count(b"K\x00") == 1  # the 0 the lists replace
    return head.replace(b"K\x00", b"]" * depth + b"a" * (depth - 1))


def nested_json(depth: int) -> bytes:
    return b'{"entries": [{"collective_seq_id": 1, "input_sizes": %s%s}]}' % (
        b"[" * depth,
        b"]" * depth,
    )
