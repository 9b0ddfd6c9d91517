"""The rank watcher arms in the rank's own process only (`lockstep.forensics.recorder`): not in
an interpreter the rank starts, nor in a process forked from it, nor in a launcher above the
ranks (no RANK). Without torch: the process has no flight recorder, a dump is its stacks."""

from __future__ import annotations

import os
import subprocess
import sys

from lockstep.forensics.recorder import DIR_ENV, PID_ENV

ARMED = """
import os, sys
from lockstep.forensics import recorder
recorder.install_from_env()
mark = os.environ.get(getattr(recorder, "PID_ENV", "LOCKSTEP_FR_RANK_PID"))
print(bool(recorder._installed), mark == str(os.getpid()))
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        raise SystemExit(0)  # its atexit runs: the rank's would dump
    os.waitpid(pid, 0)
    os._exit(0)  # the rank itself ends without its own dump
"""


def _run(folder, what: str = "", **env: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (PID_ENV, "RANK")} | env
    folder.mkdir()
    env[DIR_ENV] = str(folder)
    proc = subprocess.run([sys.executable, "-c", ARMED, what], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return proc.stdout.strip()


def test_only_the_ranks_own_process_arms(tmp_path):
    rank, helper, launcher = (tmp_path / name for name in ("rank", "helper", "launcher"))
    assert _run(rank, RANK="0") == "True True"  # the rank: armed, its pid marked
    assert (rank / "rank_0.stacks").read_text().startswith("# at exit")
    assert _run(helper, RANK="0", **{PID_ENV: "1"}) == "False False"  # started by rank pid 1
    assert _run(launcher) == "False False"  # no RANK: a launcher above the ranks
    assert not list(helper.iterdir()) and not list(launcher.iterdir())


def test_a_process_forked_from_the_rank_never_dumps(tmp_path):
    assert _run(tmp_path / "rank", "fork", RANK="0").startswith("True")  # armed
    assert not list((tmp_path / "rank").iterdir())  # the child's exit wrote no rank_0.stacks
