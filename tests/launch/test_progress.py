"""The progress a launch shows on stderr (`lockstep.launch.progress`): steps read from a metrics
file as it grows (a half-written last line waits), the newest run's file under a folder, and
plain lines on a copy of stderr that a launch pointing descriptor 2 at its log does not take."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from lockstep.launch.progress import StepReader


def test_reader_follows_whole_lines_and_the_newest_run(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    reader = StepReader(metrics, 0.0)
    assert reader.read() is None  # not written yet
    metrics.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    assert reader.read() == 1  # the second line is still being written
    with open(metrics, "a") as fh:
        fh.write('ss": 0.4}\n')
    assert reader.read() == 2
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "metrics.jsonl").write_text('{"step": 5}\n')
    folder = StepReader(runs, 0.0)
    assert folder.read() == 5 and folder.label("resume") == "resume (a)"
    (runs / "b").mkdir()
    (runs / "b" / "metrics.jsonl").write_text('{"step": 1}\n')
    os.utime(runs / "a" / "metrics.jsonl", (1, 1))  # b is the run going now
    assert folder.read() == 1 and folder.label("resume") == "resume (b)"


def test_reader_never_walks_checkpoints_and_outlives_a_folder_that_vanishes(tmp_path, monkeypatch):
    """A check's folder: runs beside their checkpoints (thousands of files when sharded or
    converted to universal, walked five times a second), wandb's and the flight recorder's
    folders, and hidden folders being written. A metrics file in any of those is not a run's;
    a folder removed while the reader walks (a universal conversion's temporary folder, seen
    on the CPU tier) is skipped, not the end of the progress thread."""
    run = tmp_path / "runs" / "resume" / "straight"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 3}\n')
    os.utime(run / "metrics.jsonl", (1, 1))
    for hidden in (
        "checkpoints/step_00000002/universal",
        ".tmp-universal/state",
        "wandb",
        "flight-recorder",
    ):
        (run.parent / hidden).mkdir(parents=True)
        (run.parent / hidden / "metrics.jsonl").write_text('{"step": 99}\n')
    gone = run.parent / "resumed-1"
    gone.mkdir()
    real_scandir = os.scandir

    def vanishing(path="."):
        if os.fspath(path) == str(gone):
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", vanishing)
    reader = StepReader(tmp_path, 0.0)
    assert reader.read() == 3 and reader.file == run / "metrics.jsonl"


def test_lines_go_to_the_command_stderr_while_descriptor_2_points_at_a_log(tmp_path):
    """What an in-process launch does (`launch.ranks._job_process`): fd 2 into the run's log."""
    program = textwrap.dedent(
        """
        import os, sys, time
        from pathlib import Path
        from lockstep.launch.progress import watching
        metrics, log = Path(sys.argv[1]), open(sys.argv[2], "w")
        with watching("world-size-2", metrics, 3):
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            for step in (1, 2, 3):
                with open(metrics, "a") as fh:
                    fh.write('{"step": %d}\\n' % step)
                time.sleep(0.3)
            os.dup2(saved, 2)
        print("verdict")
        """
    )
    metrics, log = tmp_path / "metrics.jsonl", tmp_path / "run.log"
    proc = subprocess.run(
        [sys.executable, "-c", program, str(metrics), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "verdict\n"
    lines = proc.stderr.splitlines()
    assert lines[0] == "lockstep: world-size-2: step 1/3" and lines[-1].endswith("step 3/3")
    assert "step" not in log.read_text()
