"""Dumps that blow up through the pickle's memo: one container referenced many times (a DAG),
which a hash, a `json.dumps` or a walk of the analysis expands inside one C call where no clock
is read (`crafted.py` makes them, data/crafted/ holds them). The reader charges a container at
each reference, bounds what it hashes and an entry's sizes, and reads the clock in every walk;
sound dumps, which share references too, read exactly as before."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from forensics import crafted
from forensics.hang_cli import hang_cli, one_line
from lockstep.forensics import analysis, bounds, dumps, unpickle
from support.flight_recorder import dump, entry

CRAFTED = Path(__file__).parent / "data" / "crafted"
ROOT = Path(__file__).resolve().parents[2]
WALL = 3 * bounds.MAX_CPU + 4  # the reader's floor kills it at 3 MAX_CPU + 2 s, whatever it reads
MEMORY = "a container counted at each reference to it"


@pytest.mark.parametrize(
    "case, message",
    [
        ("dag-dict", MEMORY),  # a dict's key: its hash took 10**10 steps (killed at 40 s)
        ("dag-set", MEMORY),  # a frozenset's member: the same
        ("shared-sizes", MEMORY),  # 19 s, 659 MB, and 219 MB of report
        ("shared-entries", MEMORY),  # 3.7 s of CPU checking one entry 16000 times
        ("wide-sizes", "entry 0's input_sizes hold over 16384 numbers"),  # 18 MB of report
    ],
)
def test_a_dag_through_the_memo_is_one_line_within_the_budget(tmp_path, case, message):
    """Before: past the budget in time or memory, or a report of millions of numbers."""
    code, out, err, peak, took = hang_cli(CRAFTED / case, tmp=tmp_path, timeout=WALL + 10)
    assert code == 2 and out == "", (code, out[:300], err[-2000:], took)
    line = one_line(err)
    assert f"crafted/{case}: rank_0: " in line and message in line, line
    assert took < WALL and peak < bounds.MAX_MEMORY, (took, peak)


def test_the_fixtures_are_what_crafted_py_makes():
    for case, files in crafted.FIXTURES.items():
        for name, make in files.items():
            assert (CRAFTED / case / name).read_bytes() == make(), (case, name)


def test_a_shared_container_is_charged_at_each_reference_and_read():
    """Sound pickles share references (Python's pickler memoizes every container): read, the
    sharing kept, and charged as copies."""
    sizes = [list(range(100))]
    d = {"entries": [{"collective_seq_id": 1, "input_sizes": sizes}] * 50}
    once = bounds.Budget()
    unpickle.load(pickle.dumps({"entries": [{"collective_seq_id": 1, "input_sizes": sizes}]}), once)
    shared = bounds.Budget()
    got = unpickle.load(pickle.dumps(d), shared)
    assert got == d and got["entries"][0] is got["entries"][49]
    assert shared.used > once.used + 49 * 1300, (shared.used, once.used)  # the entry's weight


def test_a_container_changed_after_it_was_shared_is_refused():
    """A cycle needs it (a list appended to itself); the weight charged would no longer hold."""
    for data in (b"]q\x00h\x00a.", b"]2]a."):  # GET then APPEND to itself; DUP then APPEND
        with pytest.raises(dumps.DumpError, match="changed after it was shared"):
            unpickle.load(data, bounds.Budget())
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(dumps.DumpError, match="changed after it was shared"):
        unpickle.load(pickle.dumps({"entries": cycle}), bounds.Budget())


@pytest.mark.parametrize("make", [crafted.dag_key, crafted.dag_member])
def test_what_is_hashed_is_bounded(make):
    """A key or set member of 4**6 leaves: within the memory, past what lockstep hashes."""
    with pytest.raises(dumps.OutOfBounds, match=r"expanded \(at byte \d+\): over the 4096"):
        dumps.loads(make(6))
    assert dumps.loads(make(1))["entries"] == []  # a small tuple key: read


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_an_entrys_sizes_and_dtypes_are_bounded(form):
    def loads(e):
        d = dump(2, [e])
        return dumps.loads(pickle.dumps(d) if form == "pickle" else json.dumps(d).encode())

    loads(entry(1, "all_reduce", size=(1,) * 16000))  # 16001 numbers: read
    with pytest.raises(dumps.OutOfBounds, match="entry 0's input_sizes hold over 16384"):
        loads(entry(1, "all_reduce", size=(1,) * 16384))
    with pytest.raises(dumps.OutOfBounds, match="entry 0's input_dtypes: a name over 64"):
        loads(entry(1, "all_reduce", dtype="F" * 65))


def test_the_clock_is_read_inside_every_walk():
    """One process group of 2000 entries on 2 ranks: the clock was read once a rank and once
    a process group (3 times), never inside a walk of the entries."""
    calls = []

    def clock(at: int):
        calls.append(1)
        if len(calls) >= at:
            raise bounds.OutOfBounds("late")

    d = {r: dump(2, ["all_reduce", "all_gather"] * 1000) for r in range(2)}
    for at in (10, 2500, 4500):  # inside the first rank's entries, the second's, the groups'
        calls.clear()
        with pytest.raises(bounds.OutOfBounds):
            analysis.analyse(d, clock=lambda at=at: clock(at))
    calls.clear()
    with pytest.raises(bounds.OutOfBounds):
        dumps.checked(d[0], lambda: clock(100))  # the checks walk the entries too


SOUND = json.loads((Path(__file__).parent / "data" / "sound-reports.json").read_text())


@pytest.mark.parametrize("folder", SOUND)
def test_sound_dumps_read_exactly_as_before(folder):
    """Real dumps (gloo, torch 2.13; NCCL on an H200, torch 2.11): the same report, text and
    JSON, and the same exit, as the reader before its floor and DAG bounds gave."""
    for mode, args in (("text", []), ("json", ["--json"])):
        argv = [sys.executable, "-m", "lockstep", "forensics", "hang", folder, *args]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (
            SOUND[folder]["exit"], SOUND[folder][mode], ""
        )  # fmt: skip
    for path in sorted((ROOT / folder).iterdir()):
        data = path.read_bytes()
        assert unpickle.load(data, bounds.Budget()) == pickle.loads(data)
