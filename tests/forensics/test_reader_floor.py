"""The floor under the reader's budgets: the dumps are read and analysed in a fresh interpreter
(`lockstep.forensics.reader`, no torch, no numpy) under RLIMIT_AS and RLIMIT_CPU, killed past
a wall time; its death is one line and exit 2 naming the folder and the limit, or, on a launch's
path, the report's line. And every file of a dumps folder is read as a regular file: a FIFO
named `rank_0.stacks` blocked `lockstep forensics hang` (and the launch that scrubs stacks)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from forensics import crafted
from forensics.hang_cli import hang_cli, one_line
from lockstep.cli import main
from lockstep.forensics import bounds, collect, hang
from lockstep.launch.forensics import last_error_line
from lockstep.launch.script import dumps_folder, launch
from support.flight_recorder import dump, pickled

GOOD = pickled(dump(2, ["all_reduce", "all_gather"]))
PLANTED = str(Path(__file__).parent / "scripts" / "planted.py")
DAG = Path(__file__).parent / "data" / "crafted" / "dag-dict" / "rank_0"


def _folder(tmp_path: Path, **files: bytes) -> Path:
    folder = tmp_path / "dumps"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_reader_imports_lockstep_forensics_only():
    boot = hang.BOOT.split("; reader.main")[0] + "; print(*sorted(sys.modules))"
    argv = [sys.executable, "-I", "-S", "-c", boot, str(hang.SRC)]
    modules = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    ours = {m for m in modules if m.startswith("lockstep")}
    forensics = ("reader", "analysis", "bounds", "dumps", "unpickle", "opcodes")
    assert ours <= {
        "lockstep",
        "lockstep.forensics",
        *(f"lockstep.forensics.{m}" for m in forensics),
    }
    assert not {m.split(".")[0] for m in modules} & {"torch", "numpy", "site"}, modules


def _special(folder: Path, kind: str, name: str) -> None:
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.parametrize(
    "kind, name, what",
    [("fifo", "rank_0.stacks", "a FIFO"), ("fifo", "rank_1", "a FIFO"),
     ("fifo", "rank_3.stacks", "a FIFO"), ("device", "rank_1", "a device"),
     ("directory", "rank_1", "a directory")],
)  # fmt: skip
def test_a_fifo_device_or_directory_in_the_folder_is_one_line(tmp_path, kind, name, what):
    """rank_0.stacks beside rank_0's dump, rank_1 where a dump should be, rank_3.stacks
    without a dump: before, the FIFOs blocked the reader for ever (its open waits for a
    writer) and the others were skipped."""
    folder = _folder(tmp_path, rank_0=GOOD)
    _special(folder, kind, name)
    code, out, err, _, took = hang_cli(folder, tmp=tmp_path, timeout=30)
    assert code == 2 and out == "", (code, err)
    assert f"dumps: {name}: not a regular file: {what}" in one_line(err)
    assert took < 10


def test_a_launch_reads_a_fifo_as_unread_and_scrubs_around_it(tmp_path):
    """On a launch's path (`hang.summary`, `collect.scrub` after a check's run), a FIFO a rank
    left is a line of the report; neither blocks."""
    folder = _folder(tmp_path, rank_0=GOOD, rank_1=GOOD)
    (folder / "rank_0.stacks").write_text(
        'File "train.py", line 3, in step\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123\n'
    )
    os.mkfifo(folder / "rank_1.stacks")
    os.symlink(tmp_path / "outside.txt", folder / "report.txt")
    done = threading.Thread(target=collect.scrub, args=(folder,), daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "collect.scrub blocked on a FIFO"
    assert "hf_abcdefghijklmnopqrstuvwxyz123" not in (folder / "rank_0.stacks").read_text()
    report = hang.report(folder, world=2)
    assert "rank_1.stacks: not a regular file: a FIFO" in report.problems, report.problems
    line = hang.summary(folder, world=2)
    assert "(report: " in line and not (tmp_path / "outside.txt").exists()  # not through it


def test_a_script_that_plants_a_fifo_and_a_dag_in_its_dumps_folder_is_still_named(tmp_path):
    """`lockstep check --script`'s launch: the script writes the folder lockstep reads (a FIFO
    as rank_7.stacks, a DAG as rank_9), then hangs. Before, the launch never came back (the
    scrub of the stacks, then the reader, blocked on the FIFO; the DAG's hash ran for hours)."""
    log = tmp_path / "run.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    start = time.monotonic()
    done = launch([PLANTED, "plant", "1", str(DAG)], 2, log, env=env, timeout=8.0,
                  forensics=dumps_folder(log))  # fmt: skip
    assert done.code is None, log.read_text()[-2000:]  # timed out
    report = done.report()
    assert "rank_7.stacks: not a regular file: a FIFO" in report.problems, report.text()
    assert any(p.startswith("rank_9: over the 256 MiB") for p in report.problems), report.text()
    assert report.versions == {0: "2.10", 1: "2.10"}, report.text()  # the others still read
    assert done.hang_report().startswith("; flight recorder: ")
    assert time.monotonic() - start < 60


def test_a_fifo_in_place_of_a_launchs_log_is_named(tmp_path):
    """The script can put a FIFO where its run's log was (its dumps folder is beside it)."""
    os.mkfifo(tmp_path / "run.log")
    assert last_error_line(tmp_path / "run.log") == "the log: not a regular file: a FIFO"
    (tmp_path / "big.log").write_bytes(b"x" * 100 + b"\nValueError: the last one\n")
    assert last_error_line(tmp_path / "big.log") == "ValueError: the last one"


def test_the_floor_of_memory_is_one_line(tmp_path, monkeypatch, capsys):
    """The budget out of the way: a million empty dicts take more than a 64 MiB address space,
    and the reader dies of it (MemoryError under RLIMIT_AS)."""
    folder = _folder(tmp_path, rank_0=crafted.many_dicts(1_000_000))
    monkeypatch.setattr(bounds, "MAX_MEMORY", 2**40)
    monkeypatch.setattr(bounds, "MAX_SPACE", 64 * 2**20)
    assert main(["forensics", "hang", str(folder)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.endswith("dumps: the reader ran out of its 64 MiB of address space (RLIMIT_AS)")


def test_the_floor_of_cpu_is_one_line(tmp_path, monkeypatch, capsys):
    """The deadline out of the way: 40000 integer keys whose hashes collide take seconds of
    CPU (each insertion walks the others), and the reader dies at its 1 s (SIGXCPU)."""
    folder = _folder(tmp_path, rank_0=crafted.colliding_keys(40_000))
    monkeypatch.setattr(bounds, "MAX_SECONDS", 600.0)
    monkeypatch.setattr(bounds, "MAX_CPU", 1)
    assert main(["forensics", "hang", str(folder)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.endswith("dumps: the reader used up its 1 s of CPU (RLIMIT_CPU)"), line


def test_the_clock_stops_colliding_keys(tmp_path, monkeypatch, capsys):
    """Within the deadline's reach: the keys' batch looks at the clock as it goes (all their
    insertions were one opcode, 16 s of CPU, between two looks)."""
    folder = _folder(tmp_path, rank_0=crafted.colliding_keys(40_000))
    monkeypatch.setattr(bounds, "MAX_SECONDS", 0.5)
    start = time.monotonic()
    assert main(["forensics", "hang", str(folder)]) == 2
    assert "over the 0.5 s lockstep reads and analyses" in one_line(capsys.readouterr().err)
    assert time.monotonic() - start < 3


def test_a_reader_past_its_wall_time_or_killed_is_one_line(tmp_path, monkeypatch, capsys):
    """A reader that neither reads nor uses CPU (blocked) is killed at 3 MAX_CPU + 2 s of wall
    time; one killed outright (SIGKILL: RLIMIT_CPU's hard limit, the OOM killer) is named so,
    and on a launch's path the summary says it."""
    folder = _folder(tmp_path, rank_0=GOOD)
    monkeypatch.setattr(hang, "BOOT", "import time; time.sleep(60)")
    monkeypatch.setattr(bounds, "MAX_CPU", 1)
    assert main(["forensics", "hang", str(folder)]) == 2
    assert one_line(capsys.readouterr().err).endswith("the reader ran past 5 s and was killed")
    monkeypatch.setattr(hang, "BOOT", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    killed = "the reader was killed (SIGKILL: past its 1 s of CPU, or its 512 MiB)"
    assert hang.summary(folder) == f"; flight recorder: {killed} ({folder})"
