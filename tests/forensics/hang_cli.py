"""`lockstep forensics hang FOLDER` run for real, in a process of its own whose address space is
limited to 1 GiB (a regression fails there instead of taking the machine's memory): its exit
code, output, peak resident memory and wall time. The peak is the larger of the command's own
(VmHWM: not the forked parent's that `wait4` would count) and its reader's (the process it
starts, `lockstep.forensics.reader`: RUSAGE_CHILDREN at its exit)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

RUN = """
import atexit, resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
def peak(path=sys.argv.pop(1)):
    own = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
    reader = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    open(path, "w").write(f"{own} {reader}")
atexit.register(peak)
sys.argv[0] = "lockstep"
runpy.run_module("lockstep", run_name="__main__")
"""


def hang_cli(folder: Path, *args: str, tmp: Path, timeout: float = 60.0):
    """`lockstep forensics hang FOLDER ARGS`: exit code, stdout, stderr, peak resident memory
    (bytes) and wall time; its files in `tmp`; killed past `timeout` (exit code None then)."""
    out, err, hwm = (tmp / name for name in ("out.txt", "err.txt", "hwm.txt"))
    start = time.monotonic()
    argv = [sys.executable, "-c", RUN, str(hwm), "forensics", "hang", str(folder), *args]
    with open(out, "w") as o, open(err, "w") as e:
        try:
            code = subprocess.run(argv, stdout=o, stderr=e, timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            code = None
    took = time.monotonic() - start
    peak = max(map(int, hwm.read_text().split())) * 1024 if hwm.exists() else None
    return code, out.read_text(), err.read_text(), peak, took


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lockstep: error: "), stderr[-2000:]
    return lines[0]
