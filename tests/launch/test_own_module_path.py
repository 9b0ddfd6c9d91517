"""lockstep's own `python -m lockstep` ranks run with `-P` (issue #37): a `lockstep/` that another
user planted in the working folder (a world-writable one, say) is never what runs, while a
user's script still imports the files beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lockstep.launch import run_local_cli

PLANT = "import pathlib; pathlib.Path(__file__).parents[1].joinpath('ran').write_text('planted')\n"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="planting as another user needs root and setpriv",
)


@pytest.fixture
def shared():
    """A world-writable folder, as /tmp is (pytest's own tmp folders are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="planted-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_module_planted_by_another_user_never_runs_in_lockstep_s_ranks(shared, monkeypatch):
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    plant = f'mkdir {shared}/lockstep && printf %s "$0" >{shared}/lockstep/__init__.py'
    subprocess.run([*nobody, "sh", "-c", plant, PLANT], check=True)
    ran = shared / "ran"
    # The plant is real: a plain `python -m lockstep` from that folder runs it.
    subprocess.run([sys.executable, "-m", "lockstep", "--help"], cwd=shared, check=False,
                   capture_output=True)  # fmt: skip
    assert ran.read_text() == "planted"
    ran.unlink()
    monkeypatch.chdir(shared)
    assert run_local_cli(1, ["--version"]) == 0  # imports `lockstep` first, torch never
    assert not ran.exists(), "a rank of lockstep imported the planted package"
