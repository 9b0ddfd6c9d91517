"""Dumps crafted past the reader's bounds (`lockstep.forensics.bounds`): `lockstep forensics hang`
takes at most 256 MiB and 10 s whatever a folder holds, and says what is past a bound in one
line with exit 2, never a traceback. The CLI runs in a process of its own (`hang_cli`)."""

from __future__ import annotations

import json
import pickle
import tracemalloc
from pathlib import Path

import pytest

from forensics.hang_cli import hang_cli, one_line
from lockstep.cli import main
from lockstep.forensics import analysis, bounds, dumps, unpickle
from support.flight_recorder import (
    dump,
    far_apart,
    memo_pickle,
    nested_json,
    nested_pickle,
    pickled,
)


def _hang(folder: Path, *args: str, timeout: float = 60.0):
    return hang_cli(folder, *args, tmp=folder.parent, timeout=timeout)


def _folder(tmp_path: Path, **files: bytes) -> Path:
    folder = tmp_path / "dumps"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize(
    "crafted",
    [memo_pickle(2**26), memo_pickle(2**32 - 1), memo_pickle(10**12, text=True)],
    ids=["LONG_BINPUT-2**26", "BINPUT-then-LONG_BINPUT-2**32-1", "PUT-10**12"],
)
def test_a_tiny_pickle_with_a_huge_memo_index(tmp_path, crafted):
    """9 bytes made the C unpickler allocate 1.06 GB (its memo grows to the index named)."""
    assert len(crafted) <= 17
    code, out, err, peak, took = _hang(_folder(tmp_path, rank_0=crafted))
    assert code == 2 and out == ""
    assert "rank_0: memo index" in one_line(err)
    assert peak < 256 * 2**20 and took < 10, (peak, took)


def test_sequence_numbers_far_apart_are_read_in_time(tmp_path):
    """Two dumps of #1 and #10**15 looped forever in `_first_disagreement`."""
    folder = _folder(tmp_path, rank_0=far_apart(), rank_1=far_apart())
    code, out, err, _, took = _hang(folder, timeout=30)
    assert code == 1, err[-2000:]
    assert "ranks 0, 1 wait in all_reduce #1000000000000000" in out
    assert took < 10, took
    folder = _folder(tmp_path / "b", rank_0=far_apart(), rank_1=far_apart("broadcast"))
    code, out, err, _, took = _hang(folder, timeout=30)
    assert code == 1, err[-2000:]
    assert "no majority at #1000000000000000" in out and "rank 1: broadcast" in out
    assert took < 10, took


def test_a_sequence_number_past_torchs_int64(tmp_path):
    folder = _folder(tmp_path, rank_0=far_apart(seq=2**64), rank_1=far_apart())
    code, out, err, _, _ = _hang(folder)
    assert code == 2 and out == ""
    assert "rank_0: entry 1's collective_seq_id 18446744073709551616 outside" in one_line(err)


@pytest.mark.parametrize("kind", ["pickle", "json"])
def test_deep_nesting(tmp_path, kind):
    """100000 lists one in the other: the JSON parser recursed (a traceback); the analysis
    recursed into the pickle's (json.dumps of the sizes, a traceback)."""
    crafted = nested_pickle(100_000) if kind == "pickle" else nested_json(100_000)
    code, out, err, peak, _ = _hang(_folder(tmp_path, rank_0=crafted))
    assert code == 2 and out == ""
    assert "nested over 32 deep" in one_line(err)
    assert peak < 256 * 2**20
    for depth, readable in ((29, True), (30, False)):  # in 3: 32 and 33 deep (torch's: 5)
        data = nested_pickle(depth) if kind == "pickle" else nested_json(depth)
        try:
            dumps.loads(data)
        except dumps.DumpError as err:  # nested lists are not sizes: refused, but read
            assert readable != isinstance(err, dumps.OutOfBounds), err


CLAIMS = {
    "BINUNICODE8 of 2**40 bytes": b"\x80\x04\x8d" + (2**40).to_bytes(8, "little") + b"x.",
    "BINBYTES8 of 200 MiB": b"\x80\x04\x8e" + (200 * 2**20).to_bytes(8, "little") + b"x.",
    "BINUNICODE of 2**32-1 bytes": b"X\xff\xff\xff\xffx.",
    "LONG4 of 2**31-1 bytes": b"\x8b\xff\xff\xff\x7fx.",
    "FRAME of 2**62 bytes": b"\x80\x04\x95" + (2**62).to_bytes(8, "little") + b"N.",
}


@pytest.mark.parametrize("crafted", CLAIMS.values(), ids=CLAIMS.keys())
def test_lengths_claimed_past_the_pickle(tmp_path, crafted):
    code, out, err, peak, _ = _hang(_folder(tmp_path, rank_0=crafted))
    assert code == 2 and out == ""
    line = one_line(err)
    assert "rank_0: " in line and (
        "where" in line or "past the end" in line or "(at most 256)" in line
    )
    assert peak < 256 * 2**20


def test_huge_numbers_of_ranks_claimed(tmp_path):
    """A process group naming rank 10**11 (its ranks' text listed every rank between), and
    `--world 10**12` (a set of that many ranks): both ran out of memory."""
    d = dump(2, ["all_reduce"])
    d["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3, 100000000000]"
    code, out, err, peak, _ = _hang(_folder(tmp_path, rank_0=pickled(d), rank_1=pickled(d)))
    assert code == 2 and out == ""
    assert "pg_config[0] names a rank outside 0..65535" in one_line(err)
    good = _folder(tmp_path / "b", rank_0=pickled(dump(2, ["all_reduce"])))
    code, out, err, peak, _ = _hang(good, "--world", str(10**12))
    assert code == 2 and out == ""
    assert "--world must be 1..65536" in one_line(err)
    assert peak < 256 * 2**20


def test_a_dump_file_claimed_over_256_mib_by_its_size(tmp_path):
    """A sparse file of 300 MiB (no data written): refused by its size, never read."""
    folder = _folder(tmp_path, rank_1=pickled(dump(2, ["all_reduce"])))
    with open(folder / "rank_0", "wb") as f:
        f.truncate(300 * 2**20)
    code, out, err, peak, _ = _hang(folder)
    assert code == 2 and out == ""
    assert "rank_0: 300 MiB, over the 64 MiB a dump may be" in one_line(err)
    assert peak < 64 * 2**20


def test_the_folders_dumps_share_one_budget(tmp_path, monkeypatch, capsys):
    """Each dump within the bounds, the folder's together not: exit 2 at the one that tips it."""
    monkeypatch.setattr(bounds, "MAX_MEMORY", 2**20)
    history = ["all_reduce", "all_gather"] * 100
    folder = _folder(tmp_path, **{f"rank_{r}": pickled(dump(8, history)) for r in range(8)})
    assert main(["forensics", "hang", str(folder)]) == 2
    line = one_line(capsys.readouterr().err)
    assert ": over the 1 MiB lockstep reads a folder of dumps within" in line
    monkeypatch.setattr(bounds, "MAX_SECONDS", 0.0)
    monkeypatch.setattr(bounds, "MAX_MEMORY", 256 * 2**20)
    assert main(["forensics", "hang", str(folder)]) == 2
    assert "over the 0 s lockstep reads and analyses a folder of dumps" in capsys.readouterr().err


MALFORMED = {
    "entries of numbers": {"entries": [1, 2]},
    "a process group of a number": {"entries": [{"collective_seq_id": 1, "process_group": 5}]},
    "sizes of a string": {"entries": [{"collective_seq_id": 1, "input_sizes": "x"}]},
    "dtypes of numbers": {"entries": [{"collective_seq_id": 1, "input_dtypes": [1, "a"]}]},
    "a sequence number of a string": {"entries": [{"collective_seq_id": "x"}]},
    "pg_status of a list": {"entries": [], "pg_status": [1]},
    "pg_config ranks of nested lists": {"entries": [], "pg_config": {"0": {"ranks": "[[[["}}},
}


@pytest.mark.parametrize("crafted", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_dump_of_the_wrong_types_isone_line(tmp_path, capsys, crafted):
    folder = _folder(tmp_path, rank_0=pickle.dumps(crafted), rank_1=json.dumps(crafted).encode())
    assert main(["forensics", "hang", str(folder)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "no flight-recorder dump read (rank_0: not a dump" in line
    assert "; rank_1: not a dump" in line


def test_a_name_with_control_characters_isone_line(tmp_path, capsys):
    folder = _folder(tmp_path, **{"bad\nname_0": b"\x00garbage"})
    assert main(["forensics", "hang", str(folder)]) == 2
    assert "bad\\nname_0: not a dump" in one_line(capsys.readouterr().err)


N = 5_000
PATTERNS = {  # what costs a byte the most: empty containers, one-item ones, memo, dict items
    "empty lists": b"(" + b"]" * N + b"l.",
    "empty dicts": b"(" + b"}" * N + b"l.",
    "empty sets": b"(" + b"\x8f" * N + b"l.",
    "one-item lists": b"(" + b"]Na" * N + b"l.",
    "one-item dicts": b"(" + b"}KxNs" * N + b"l.",
    "tuples": b"(" + b"N\x85" * N + b"l.",
    "dict items": b"}(" + b"".join(b"J" + i.to_bytes(4, "little") + b"N" for i in range(N)) + b"u.",
    "appends": b"](" + b"N" * N + b"e.",
    "memo": b"(" + b"".join(b"]r" + i.to_bytes(4, "little") for i in range(N)) + b"l.",
    "memoize": b"\x80\x04(" + b"]\x94" * N + b"l.",
    "nested pairs": b"(" + b"]]a" * N + b"l.",
    "wide strings": b"(" + b"X\x04\x00\x00\x00\xf0\x9f\x98\x80" * N + b"l.",
}


@pytest.mark.parametrize("data", PATTERNS.values(), ids=PATTERNS.keys())
def test_what_the_reader_charges_covers_what_it_allocates(data):
    """The budget bounds memory only if each object's charge covers what CPython allocates
    for it (tracemalloc's peak), for the patterns that cost the most a byte."""
    budget = bounds.Budget(seconds=600)  # tracemalloc slows it down
    tracemalloc.start()
    try:
        unpickle.load(data, budget)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert budget.peak >= peak, (budget.peak, peak)


@pytest.mark.parametrize(
    "data",
    [b"[" + b"[]," * N + b"[]]", b"[" + b"{}," * N + b"{}]", b"[" + b'{"":0},' * N + b"0]",
     b"[" + b"[[0]]," * N + b"0]", b'["' + b"a" * N + b'\\ud83d\\ude00"]'],
)  # fmt: skip
def test_a_json_dumps_cost_covers_what_json_allocates(data):
    tracemalloc.start()
    try:
        json.loads(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bounds.json_cost(data) >= peak


def test_the_reader_reads_what_pickle_writes():
    """Every protocol's opcodes for builtins (0-3 write sets and bytes by calling a class:
    refused), shared references kept; a refused one names what it calls."""
    shared = [1, 2]
    obj = {"a": [None, True, False, 0, 255, 65535, -1, 2**31, 2**70, -(2**70), 1.5, "x", "é",
                 "\U0001f600", (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), {"k": {}}, shared],
           "b": shared}  # fmt: skip
    for protocol in range(6):
        got = unpickle.load(pickle.dumps(obj, protocol=protocol), bounds.Budget())
        assert got == obj and got["a"][-1] is got["b"], protocol
    extra = {"s": {1, 2}, "f": frozenset({3}), "y": b"by", "z": bytearray(b"z")}
    assert unpickle.load(pickle.dumps(extra, protocol=5), bounds.Budget()) == extra
    with pytest.raises(dumps.DumpError, match=r"refused: the dump names builtins\.set"):
        unpickle.load(pickle.dumps(extra, protocol=3), bounds.Budget())


def test_the_analysis_is_within_the_deadline_too():
    """The deadline covers the analysis after the reading: it looks at the clock for each
    rank and process group (many process groups, each out of step, took seconds)."""
    calls = []

    def clock():
        calls.append(1)
        if len(calls) > 2:
            raise bounds.OutOfBounds("late")

    d = {r: dump(2, ["all_reduce", "broadcast" if r else "all_gather"]) for r in range(2)}
    with pytest.raises(bounds.OutOfBounds):
        analysis.analyse(d, clock=clock)
    assert len(calls) == 3  # two ranks, then the one process group


def test_a_dumps_text_is_shown_escaped(tmp_path, capsys):
    """An op's name, a process group's and a rank's stack come from files: their control
    characters (a newline, a terminal escape) are shown escaped, and long ones cut."""
    d = [dump(2, ["all_reduce", op]) for op in ("all_gather", "evil\x1b[2J\nname" + "x" * 500)]
    d[1]["entries"][1]["process_group"] = ("0", "default_pg")
    folder = _folder(tmp_path, rank_0=pickled(d[0]), rank_1=pickled(d[1]))
    (folder / "rank_1.stacks").write_text('File "train.py", line 9 in step\x1b[31m\n')
    assert main(["forensics", "hang", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\x1b[2J\\nname" in out, out
    assert "x" * 200 not in out and 'train.py", line 9 in step\\x1b[31m' in out
