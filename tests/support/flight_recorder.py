"""Flight-recorder dumps as torch 2.13 writes them (`_dump_fr_trace()` on gloo ranks)."""

from __future__ import annotations

import pickle


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
