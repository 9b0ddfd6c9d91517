"""A file the user names that is no regular file (/dev/zero, a FIFO, a folder) is one line and
exit 2 within seconds, never a wait or a MemoryError: each case runs `python -m lockstep` in a
process of its own, under a timeout (a FIFO blocks a plain open until a writer comes) and a
memory limit (a plain read of /dev/zero grows until memory runs out)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep import inputs
from lockstep.errors import UsageError
from lockstep.gate import golden
from support.inprocess import assert_one_error_line

TIMEOUT_S = 30  # the refusal takes well under a second; a blocked open never ends
MEMORY = 2 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lockstep", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_limit_memory,
        check=False,
    )


@pytest.fixture
def odd(tmp_path) -> Path:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    return tmp_path


CASES = {
    "diff of /dev/zero": (["diff", "/dev/zero", "/dev/zero"], "is a character device"),
    "diff of a FIFO": (["diff", "fifo.json", "fifo.json"], "is a pipe (FIFO)"),
    "diff of a folder": (["diff", "folder.json", "folder.json"], "is a folder"),
    "gate compare of /dev/zero": (["gate", "compare", "/dev/zero", "/dev/zero"],
                                  "is a character device"),
    "gate compare of a FIFO": (["gate", "compare", "fifo.json", "fifo.json"], "is a pipe (FIFO)"),
    "ds-config of a FIFO": (["ds-config", "fifo.json", "--world-size", "2"], "is a pipe (FIFO)"),
    "ds-config of /dev/zero": (["ds-config", "/dev/zero", "--world-size", "2"],
                               "is a character device"),
    "ds-config of a folder": (["ds-config", "folder.json", "--world-size", "2"], "is a folder"),
    "alert rules of a FIFO": (["gate", "alerts", "fifo.json", "fifo.json"], "is a pipe (FIFO)"),
    "a run config of a FIFO": (["train", "fifo.json", "--nproc", "2"], "is a pipe (FIFO)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_file_that_is_no_file_is_one_line_and_exit_2(odd, case):
    argv, said = CASES[case]
    assert_one_error_line(run_cli(argv, odd), said)


def test_the_bound_counts_bytes_read_not_the_size_stat_reports(tmp_path, monkeypatch):
    """/proc reports a size of 0 for a file that has text: the bound still holds."""
    status = Path("/proc/self/status")
    assert status.stat().st_size == 0
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 64)
    with pytest.raises(UsageError, match="status is over 64 bytes"):
        inputs.read_text(status, "status")
    (tmp_path / "exact").write_bytes(b"x" * 64)
    (tmp_path / "over").write_bytes(b"x" * 65)
    assert inputs.read_text(tmp_path / "exact", "file") == "x" * 64
    with pytest.raises(UsageError, match="over 64 bytes"):
        inputs.read_text(tmp_path / "over", "file")


def test_a_socket_is_named_as_one(tmp_path):
    """open() of a socket fails (ENXIO): the refusal still says what the path is."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "rules.toml"))
        with pytest.raises(UsageError, match=r"rules\.toml is a socket: give a file"):
            inputs.read_text(tmp_path / "rules.toml", "alert rules")


def test_a_goldens_folder_skips_a_fifo_among_its_goldens(tmp_path):
    """`gate check` lists the goldens recorded under a name: a FIFO there is passed over, not
    waited on (run in a process of its own: the wait would never end)."""
    folder = tmp_path / "gates" / "smoke"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "fifo.json")
    (folder / "cpu.json").write_text(json.dumps({"env": {"key_fields": {"engine": "ddp"}}}))
    code = (
        "import sys; from pathlib import Path; from lockstep.gate import golden\n"
        "print(golden.recorded(Path(sys.argv[1]), 'smoke'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "gates")],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                            capture_output=True, text=True, timeout=TIMEOUT_S, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'cpu': {'engine': 'ddp'}}"
    assert golden.recorded(tmp_path / "gates", "none") == {}


def test_a_fifo_as_a_checkpoints_pointer_or_manifest_is_one_line(tmp_path):
    """`checkpoint.resume` names the user's folder: its pointer and manifest are read bounded."""
    from lockstep.train import checkpoint

    os.mkfifo(tmp_path / checkpoint.LATEST)
    with pytest.raises(UsageError, match="pipe"):
        checkpoint.find(tmp_path, "auto")
    step = tmp_path / "step_00000002"
    step.mkdir()
    os.mkfifo(step / checkpoint.MANIFEST)
    with pytest.raises(UsageError, match=r"no readable manifest\.json .*pipe"):
        checkpoint.verify(step)
