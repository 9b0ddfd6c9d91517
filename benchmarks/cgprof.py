"""pytest plugin: the CPU-seconds of each test, child processes included (`-p cgprof`).

A test here mostly launches ranks, so its own process's CPU says little; each pytest process
(an xdist worker, or pytest itself with `-n 0`) moves into a cpuacct cgroup of its own (v1,
root) and reads its usage around each test; its children inherit the cgroup. One JSON line a
test (id, cpu, wall) goes to $CGPROF_OUT. CPU-seconds compare fairly under a shared load; wall
time does not. Used for docs/benchmarks.md, "Fewer launches and cheaper forked ranks":

    CGPROF_OUT=/tmp/prof.jsonl PYTHONPATH=benchmarks pytest -p cgprof -n 0 -q -p no:cacheprovider tests/checks
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

ROOT = "/sys/fs/cgroup/cpuacct"
_cgroup: str | None = None


def _usage() -> float:
    with open(f"{_cgroup}/cpuacct.usage") as f:
        return int(f.read()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _cgroup
    if _cgroup is None:
        _cgroup = f"{ROOT}/cgprof-{os.getpid()}"
        os.makedirs(_cgroup, exist_ok=True)
        with open(f"{_cgroup}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    cpu, wall = _usage(), time.monotonic()
    yield
    row = {"id": item.nodeid, "cpu": _usage() - cpu, "wall": time.monotonic() - wall}
    with open(os.environ.get("CGPROF_OUT", "cgprof.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_unconfigure(config):
    """Back to the root cgroup; the cgroup removed once its last process has ended. A
    forkserver ends only when this process has exited (its pipe closes), so a detached shell
    removes it then, giving up after 120 s: nothing left behind."""
    if _cgroup is None:
        return
    with open(f"{ROOT}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    remove = f"for i in $(seq 120); do rmdir {_cgroup} 2>/dev/null && exit; sleep 1; done"
    subprocess.Popen(["sh", "-c", remove], start_new_session=True)
