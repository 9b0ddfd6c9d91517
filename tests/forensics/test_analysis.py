"""Planted hangs named right from their dumps, on 2 and 4 ranks (pure analysis, no ranks)."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from lockstep.forensics import analysis, dumps, hang
from support.flight_recorder import dump, entry, pickled

HISTORY = ["all_reduce", "all_gather"] * 2  # #1..#4, every rank agrees


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("odd", [0, 1])
def test_a_rank_in_a_different_collective(world, odd):
    odd = odd * (world - 1)  # rank 0 or the last rank
    d = {r: dump(world, [*HISTORY, "broadcast" if r == odd else "all_reduce"])
         for r in range(world)}  # fmt: skip
    report = analysis.analyse(d, world=world)
    (f,) = report.findings
    assert f.odd == [odd] and f.seq == 5
    assert f"rank {odd} entered broadcast #5 while" in f.headline
    assert "in all_reduce #5" in f.headline
    assert "no majority" not in f.headline


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("odd", [0, 1])
def test_a_rank_that_skips_a_collective(world, odd):
    odd = odd * (world - 1)
    d = {r: dump(world, [*HISTORY, "all_gather" if r == odd else "all_reduce"])
         for r in range(world)}  # fmt: skip
    (f,) = analysis.analyse(d, world=world).findings
    assert f.odd == [odd] and f.kind == "skipped"
    assert f"rank {odd} skipped all_reduce #5" in f.headline


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("odd", [0, 1])
def test_a_rank_in_python_with_no_collective_pending(world, odd):
    odd = odd * (world - 1)
    d = {r: dump(world, HISTORY if r == odd else [*HISTORY, "all_reduce"],
                 completed=4) for r in range(world)}  # fmt: skip
    stacks = {odd: 'Thread 0x1 (most recent call first):\n  File "train.py", line 9 in step\n'}
    report = analysis.analyse(d, world=world, stacks=stacks)
    (f,) = report.findings
    assert f.odd == [odd] and f.kind == "in Python"
    assert f"rank {odd} never reached #5 (last collective #4, none pending" in f.headline
    assert 'train.py", line 9' in report.text()


@pytest.mark.parametrize("world", [2, 4])
def test_a_status_that_lags_behind_a_peers_is_not_read_as_everyone_waiting(world):
    """gloo's last_completed_collective lagged two collectives on the rank blocked in #5 at its
    dump (a fresh clone's run): a peer completed #4, so that rank had completed #3 and #4."""
    d = {r: dump(world, [*HISTORY, "all_reduce"], completed=2) for r in range(1, world)}
    d[0] = dump(world, HISTORY, completed=4)
    (f,) = analysis.analyse(d, world=world).findings
    assert f.odd == [0] and f.kind == "in Python", f.headline
    assert f.headline.startswith("rank 0 never reached #5 (last collective #4, none pending")


def test_a_rooted_collective_a_peer_completed_still_waits():
    # the root of a broadcast completes while another rank still waits to receive: rank 1 is
    # not taken as done with #5 (then nobody would be pending, and there would be no finding)
    d = {0: dump(2, [*HISTORY, "broadcast"], completed=5), 1: dump(2, [*HISTORY, "broadcast"])}
    (f,) = analysis.analyse(d, world=2).findings
    assert f.seq == 5 and "broadcast #5" in f.headline, f.headline


def test_the_gloo_dumps_of_a_lagging_status_are_read_right():
    """Two real gloo dumps (torch 2.13, forked ranks, a loaded machine): rank 0 in Python after
    #4, rank 1 in all_reduce #5 with last_completed_collective still 2."""
    report = hang.report(Path(__file__).parent / "data" / "gloo-status-lag")
    (f,) = report.findings
    assert f.headline == ("rank 0 never reached #5 (last collective #4, none pending: in "
                          "Python) while rank 1 waits in all_reduce #5"), report.text()  # fmt: skip


@pytest.mark.parametrize("world", [2, 4])
def test_sizes_that_differ_name_the_rank(world):
    odd = world - 1
    d = {r: dump(world, [*HISTORY, entry(5, "all_reduce", size=(8,) if r == odd else (4,))])
         for r in range(world)}  # fmt: skip
    (f,) = analysis.analyse(d, world=world).findings
    assert f.kind == "sizes differ"
    if world > 2:
        assert f.odd == [odd]
        assert f"rank {odd} entered all_reduce #5 with [8] Float" in f.headline
    else:  # two ranks, two sizes: both named
        assert "[8] Float" in f.headline and "[4] Float" in f.headline


def test_a_missing_dump_and_all_waiting():
    d = {r: dump(4, [*HISTORY, "all_reduce"]) for r in range(3)}
    report = analysis.analyse(d, world=4)
    assert report.no_dump == [3]
    assert "ranks 0-2 wait in all_reduce #5" in report.text()
    assert "no dump from rank 3" in report.text()


def test_a_clean_run_names_nobody():
    d = {r: dump(2, HISTORY, completed=4) for r in range(2)}
    assert analysis.analyse(d).findings == []


def test_dump_without_pg_status_older_format():
    d = {}
    for r in range(2):
        x = dump(2, [*HISTORY, "broadcast" if r else "all_reduce"], version="2.4")
        del x["pg_status"]
        for e in x["entries"][:4]:
            e["state"] = "completed"
        d[r] = x
    (f,) = analysis.analyse(d).findings
    assert f.seq == 5


class Planted:
    def __reduce__(self):
        return (print, ("pwned",))


def test_the_restricted_unpickler_refuses_a_planted_pickle(tmp_path, capsys):
    bad = dump(2, HISTORY)
    bad["entries"].append(Planted())
    (tmp_path / "rank_1").write_bytes(pickle.dumps(bad))
    (tmp_path / "rank_0").write_bytes(pickled(dump(2, HISTORY)))
    found, problems = dumps.load_dir(tmp_path)
    assert list(found) == [0]
    assert "refused: the dump names builtins.print" in problems[0]
    assert "pwned" not in capsys.readouterr().out
    with pytest.raises(dumps.DumpError):
        dumps.loads(pickle.dumps({"entries": [], "x": dumps.Dump}))


def test_rank_numbers_far_apart_and_ranks_text_deep():
    """Ranks named far apart (their text listed every rank between), and a process group's
    ranks as text nested deep (json.loads recursed): named, and read as numbers."""
    assert analysis.ranks_text([3, 2, 10**12]) == "ranks 2, 3, 1000000000000"
    assert analysis.ranks_text([4, 2, 3]) == "ranks 2-4"
    assert analysis.ranks_text(range(0, 40000, 2)) == (
        "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, ... (20000 ranks)"
    )  # in every finding's headline: 20000 of them took GBs
    d = {r: dump(2, [*HISTORY, "all_reduce"]) for r in range(2)}
    d[0]["pg_config"]["0"]["ranks"] = "[" * 100_000 + "0, 1, 5" + "]" * 100_000
    report = analysis.analyse(d)
    assert report.no_dump == [5]


H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


def test_an_nccl_dump_without_a_collective_is_not_judged(capsys, tmp_path):
    """The dump `_dump_fr_trace()` gave under NCCL on an H200 (torch 2.11, after four completed
    collectives) holds no entry: "nothing out of step" would be said of nothing (exit 4); the
    same folder with one real collective beside it is judged again."""
    from lockstep.cli import main

    assert main(["forensics", "hang", str(H200 / "fr-empty")]) == 4
    out = capsys.readouterr().out
    assert "not judged: the dumps of rank 0 hold no collective" in out
    assert "no collective out of step" not in out
    (tmp_path / "nccl_trace_rank_0").write_bytes(
        (H200 / "fr-empty" / "nccl_trace_rank_0").read_bytes()
    )
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickled(dump(2, ["all_reduce"], completed=1)))
    report = hang.report(tmp_path)
    assert report.judged and report.empty == [0], report.text()


def test_an_nccl_dump_read_before_the_watchdog_polled_says_nothing_waits(capsys, tmp_path):
    """lockstep's own dump under NCCL on an H200 (`_dump_nccl_trace`, torch 2.11) right after
    four collectives: every entry completed while `pg_status` still said -1, since NCCL's
    watchdog had not polled. Nothing waits (exit 0); a second rank that never reached the
    third collective, while rank 0 waits in it, is named at that collective."""
    from lockstep.cli import main

    src = H200 / "fr-nccl" / "nccl_trace_rank_0"
    record = pickle.loads(src.read_bytes())
    assert [e["state"] for e in record["entries"]] == ["completed"] * 4
    assert record["pg_status"]["0"]["last_completed_collective"] == -1
    assert main(["forensics", "hang", str(src.parent)]) == 0, capsys.readouterr().out
    assert "no collective out of step" in capsys.readouterr().out
    record["pg_config"]["0"]["ranks"] = "[0, 1]"
    waiting = copy.deepcopy(record)  # rank 0 in all_gather #3, its entry not completed
    waiting["entries"] = waiting["entries"][:3]
    waiting["entries"][2]["state"] = "scheduled"
    waiting["pg_status"]["0"].update(last_enqueued_collective=3)
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(waiting))
    stuck = copy.deepcopy(record)  # rank 1 never reached it
    stuck["entries"] = stuck["entries"][:2]
    stuck["pg_status"]["0"].update(last_enqueued_collective=2)
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(stuck))
    report = hang.report(tmp_path)
    assert report.judged, report.text()
    assert "all_gather" in report.text() and "rank 1" in report.text(), report.text()
