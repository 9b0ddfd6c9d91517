"""Planted faults in a user's script launched by lockstep, and a job's own dumps, named from
the ranks' flight recorders (real gloo ranks; short timeouts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.launch.script import dumps_folder, launch

PLANTED = str(Path(__file__).parent / "scripts" / "planted.py")
HELPERS = str(Path(__file__).parent / "scripts" / "helpers.py")


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")


def test_a_size_mismatch_crash_names_collective_seq_and_rank_0(tmp_path):
    log = tmp_path / "run.log"
    done = launch([PLANTED, "size", "0"], 4, log, env=_env(), timeout=120, run_path=True,
                  forensics=dumps_folder(log))  # fmt: skip
    assert done.code not in (0, None)
    cause = done.cause([], 1)
    assert "flight recorder: rank 0 entered all_reduce #2 with [8] Float" in cause, cause
    assert "ranks 1-3" in cause


def test_a_jobs_own_dumps_read_back(tmp_path, capsys):
    folder = tmp_path / "dumps"
    folder.mkdir()
    log = tmp_path / "run.log"
    done = launch(
        [PLANTED, "jobdump", "0", str(folder)], 2, log, env=_env(), timeout=120, run_path=True
    )
    assert done.code == 0, log.read_text()[-2000:]
    assert sorted(p.name for p in folder.iterdir())[0] == "nccl_trace_rank_0"
    assert main(["forensics", "hang", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "rank 0 skipped all_reduce #5: entered all_gather" in out
    assert "while rank 1 waits in all_reduce #5" in out
    assert main(["forensics", "hang", str(folder), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["odd"] == [0]


@pytest.mark.parametrize("run_path", [False, True], ids=["new interpreter", "forked rank"])
def test_helpers_a_rank_starts_leave_its_dump_alone(tmp_path, run_path):
    """Each rank starts two helper interpreters, which inherit lockstep's sitecustomize: one
    imports torch and exits after its rank dumped (it overwrote the dump with an empty one),
    one crashes (it asked every rank for its dump, so the real crash was not recorded). The
    watcher arms in the rank's own process only: the dumps record the real crash."""
    log = tmp_path / "run.log"
    done = launch([HELPERS, "crash", "1", str(tmp_path)], 2, log, env=_env(), timeout=120,
                  run_path=run_path, forensics=dumps_folder(log))  # fmt: skip
    text = log.read_text()
    # Both ranks' helpers write to the one log at once: their lines may interleave
    # ("RuntimeErrorRuntimeError: : a helper crasheda helper crashed").
    assert done.code not in (0, None) and "a helper crashed" in text, text[-3000:]
    folder = dumps_folder(log)
    stacks = [(folder / f"rank_{r}.stacks").read_text() for r in range(2)]
    assert stacks[1].startswith("# uncaught RuntimeError: the real crash on rank 1"), stacks[1]
    assert stacks[0].startswith("# asked"), stacks[0]
    report = done.report()
    assert report.versions == {0: "2.10", 1: "2.10"}, report.text()
    (f,) = report.findings
    assert f.headline == ("rank 1 never reached #2 (last collective #1, none pending: in "
                          "Python) while rank 0 waits in all_gather #2"), report.text()  # fmt: skip
    assert "helpers.py" in f.stacks[1]
