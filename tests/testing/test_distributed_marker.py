"""The lockstep pytest plugin, driven through real inner pytest processes (pytester).

Each inner run is a subprocess whose ranks inherit a unique LOCKSTEP_TEST_TAG, so a test can
tell that no process of that run outlived it. Timeouts are short to keep the suite fast. The
passing, failing and two-worker files run in one inner session on two xdist workers (`inner`),
which three tests read: two pytest processes import torch and start a forkserver, not four.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch

pytest_plugins = ["pytester"]


@pytest.fixture
def tagged(pytester, monkeypatch, tmp_path):
    """Tag the inner runs' processes and give them a probe directory; return the tag."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("LOCKSTEP_TEST_TAG", tag)
    monkeypatch.setenv("PROBE_DIR", str(tmp_path))
    return tag


def processes_tagged(tag: str, wait_s: float = 10.0) -> list[psutil.Process]:
    """Live (non-zombie) processes carrying `tag`, after waiting up to `wait_s` for none."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in psutil.process_iter():
            try:
                if (
                    proc.status() != psutil.STATUS_ZOMBIE
                    and proc.environ().get("LOCKSTEP_TEST_TAG") == tag
                ):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


PASSING = """
import os, pathlib
import pytest, torch, torch.distributed as dist
from lockstep import compat

PROBE = pathlib.Path(os.environ["PROBE_DIR"])
CACHED_GROUP = None  # as libraries (DeepSpeed) cache the groups they create


@pytest.mark.distributed(world_size=2)
def test_pass(rank, world_size, device, tmp_path):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert (t.item(), world_size, device) == (3.0, 2, torch.device("cpu"))
    assert os.environ["RANK"] == str(rank) and dist.get_rank() == rank
    (tmp_path / f"rank{rank}").write_text("shared")
    (PROBE / f"pid{rank}").write_text(str(os.getpid()))
    print(f"hello from rank {rank}")


@pytest.mark.distributed(world_size=2)
def test_dirty(rank):
    os.environ["LEAKED"] = "1"
    os.chdir("/")
    torch.manual_seed(1234)
    torch.set_default_dtype(torch.float64)
    global CACHED_GROUP
    CACHED_GROUP = dist.new_group([0, 1])


@pytest.mark.distributed(world_size=2)
def test_clean_on_the_warm_pool(rank):
    assert int((PROBE / f"pid{rank}").read_text()) == os.getpid()  # same rank process
    assert "LEAKED" not in os.environ and os.getcwd() != "/"
    assert torch.initial_seed() != 1234 and torch.get_default_dtype() == torch.float32
    assert len(compat.process_groups()) == 1 and CACHED_GROUP is None


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.distributed
def test_world_sizes(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size == dist.get_world_size()


@pytest.mark.distributed(world_size=2)
def test_skip_inside(rank):
    pytest.skip("skipped on every rank")


@pytest.mark.distributed(world_size=2, gpus=True)
def test_gpu(rank):
    pass


@pytest.mark.distributed(world_size=0)
def test_bad_marker():
    pass


def test_rank_without_marker(rank):
    pass
"""


def test_passing_tests_share_a_warm_pool(inner):
    out, tag = inner
    if torch.cuda.device_count() >= 2:
        assert outcomes(out, "test_passing.py") == {"passed": 7, "skipped": 1, "error": 2}, out
    else:
        assert outcomes(out, "test_passing.py") == {"passed": 6, "skipped": 2, "error": 2}, out
        assert "needs 2 GPUs (gpus=True), found" in out
    assert "rank 0 output" in out and "hello from rank 0" in out
    assert re.search(r"SKIPPED \[1\] test_passing.py:\d+: skipped on every rank", out)
    assert "world_size must be a positive int, got 0" in section(out, "test_bad_marker")
    assert "fixture 'rank' needs @pytest.mark.distributed" in out
    assert processes_tagged(tag) == []


FAILING = """
import os, pathlib, signal
import pytest, torch.distributed as dist

PROBE = pathlib.Path(os.environ["PROBE_DIR"])


@pytest.mark.distributed(world_size=2)
def test_fail_one(rank):
    (PROBE / f"failing-pid{rank}").write_text(str(os.getpid()))
    assert rank == 0, "rank one disagrees"


@pytest.mark.distributed(world_size=2)
def test_rebuilt_after_failure(rank):
    assert int((PROBE / f"failing-pid{rank}").read_text()) != os.getpid()  # a fresh rank
    dist.barrier()


@pytest.mark.distributed(world_size=2)
def test_fail_all(rank):
    raise ValueError(f"bad value on rank {rank}")


@pytest.mark.distributed(world_size=2)
def test_crash(rank):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(7)
"""


def test_failures_name_every_failing_rank(inner):
    out, tag = inner
    assert outcomes(out, "test_failing.py") == {"passed": 1, "failed": 3}, out

    one = section(out, "test_fail_one")
    assert "1 of 2 ranks failed: rank 1 failed" in one
    assert "AssertionError: rank one disagrees" in one and "assert 1 == 0" in one
    assert "rank 0 failed" not in one

    both = section(out, "test_fail_all")
    assert "2 of 2 ranks failed" in both
    assert "ValueError: bad value on rank 0" in both and "ValueError: bad value on rank 1" in both

    crash = section(out, "test_crash")
    assert "rank 0 died" in crash and "killed by signal SIGSEGV" in crash
    assert "Fatal Python error: Segmentation fault" in crash  # faulthandler's crash stack
    assert "rank 1 died" in crash and "exited with code 7" in crash
    assert processes_tagged(tag) == []


# torch.distributed imported in the ranks only: this session's pytest process imports no torch
# (the session above imports it at the top, as most test files do).
HANG = """
import os, pathlib, subprocess, time
import pytest


@pytest.mark.distributed(world_size=2)
def test_hang(rank):
    import torch.distributed as dist

    if rank == 1:
        child = subprocess.Popen(["sleep", "300"])
        (pathlib.Path(os.environ["PROBE_DIR"]) / "child").write_text(str(child.pid))
        while True:
            time.sleep(0.05)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=60)
def test_after_hang(rank):
    import torch.distributed as dist

    time.sleep(2.5)  # longer than the ini timeout: the marker's wins
    dist.barrier()
"""


def test_hang_shows_every_stack_and_kills_everything(pytester, tagged, tmp_path):
    pytester.makeini("[pytest]\nlockstep_timeout = 2\n")
    pytester.makepyfile(test_hang=HANG)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    out = section(result.stdout.str(), "test_hang")
    assert "2 of 2 ranks failed: rank 0 hung, rank 1 hung" in out
    assert "did not finish within the 2 s timeout" in out
    rank0, rank1 = out.split("----- rank 1 hung -----")
    assert re.search(r"line \d+ in barrier", rank0) and "in test_hang" in rank0
    assert "in test_hang" in rank1 and "worker.py" not in rank1
    assert "flight recorder:" in rank0 and "rank 1 never reached #" in rank0  # in Python
    assert processes_tagged(tagged) == []
    assert not psutil.pid_exists(int((tmp_path / "child").read_text())) or (
        psutil.Process(int((tmp_path / "child").read_text())).status() == psutil.STATUS_ZOMBIE
    )


XDIST = """
import os
import pytest, torch, torch.distributed as dist


@pytest.mark.parametrize("i", range(4))
@pytest.mark.distributed(world_size=2)
def test_sum(rank, i):
    t = torch.tensor([float(i)])
    dist.all_reduce(t)
    assert t.item() == 2 * i
    assert os.environ["PYTEST_XDIST_WORKER"] in ("gw0", "gw1")
"""


# The inner session's scheduling: two units of work, one a worker, so that each worker runs
# test_xdist.py's tests (two each, after the file they join): test_passing.py's tests share
# a warm pool and test_failing.py's check it was rebuilt, each file on one worker.
SCHEDULING = """
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            if nodeid.startswith("test_xdist.py::test_sum["):
                return ("test_passing.py", "test_failing.py")[int(nodeid[-2]) % 2]
            return nodeid.split("::")[0]

    return Scheduling(config, log)
"""


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    """One inner session, on two xdist workers, of PASSING, FAILING and XDIST: its output
    (-v, -rA) and its processes' tag, once every process of it has ended."""
    root = tmp_path_factory.mktemp("inner")
    files = {"test_passing": PASSING, "test_failing": FAILING, "test_xdist": XDIST}
    for name, text in {**files, "conftest": SCHEDULING}.items():
        (root / f"{name}.py").write_text(text)
    (root / "probe").mkdir()
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    path = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.update(LOCKSTEP_TEST_TAG=tag, PROBE_DIR=str(root / "probe"), PYTHONPATH=path,
               PY_COLORS="0")  # fmt: skip
    args = ["-p", "no:cacheprovider", "-n", "2", "-v", "-rA", f"--basetemp={root / 'tmp'}"]
    done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    return done.stdout, tag


def outcomes(out: str, module: str) -> Counter:
    """The outcomes of `module`'s tests in the short summary of an -rA session."""
    counts: Counter = Counter()
    for line in out.splitlines():
        if match := re.match(rf"(PASSED|FAILED|ERROR) {re.escape(module)}::", line):
            counts[match.group(1).lower()] += 1
        elif match := re.match(rf"SKIPPED \[(\d+)\] {re.escape(module)}:", line):
            counts["skipped"] += int(match.group(1))
    return counts


def test_two_xdist_workers(inner):
    out, tag = inner
    assert outcomes(out, "test_xdist.py") == {"passed": 4}, out
    workers = set(re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED test_xdist.py::", out))
    assert workers == {"gw0", "gw1"}, out
    assert processes_tagged(tag) == []


KILLED = """
import os, pathlib, time
import pytest


@pytest.mark.distributed(world_size=1)
def test_sleep(rank):
    (pathlib.Path(os.environ["PROBE_DIR"]) / f"rank{rank}").write_text(str(os.getpid()))
    time.sleep(300)
"""


def test_ranks_die_with_a_killed_pytest(pytester, tagged, tmp_path, monkeypatch, request):
    pytester.makepyfile(test_killed=KILLED)
    # A temp folder of these sessions' own: any other pytest session starting meanwhile (the
    # tier's other workers start inner ones) would remove the orphaned pool directory first.
    # Short, beside /tmp, not under tmp_path: the forkserver's AF_UNIX socket goes in it, and
    # a path past 107 bytes cannot be bound (pytest's numbered folders grow run after run).
    temp = Path(tempfile.mkdtemp(prefix="lsk-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", str(temp))
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "rank0").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "rank0").exists(), "the rank never started"
    finally:
        inner.send_signal(signal.SIGKILL)
        inner.wait()
    assert processes_tagged(tagged) == []
    orphaned = list(temp.glob(f"lockstep-pool-{inner.pid}-*"))
    assert orphaned, "the killed session had no chance to remove its pool directory"
    pytester.runpytest_subprocess("--collect-only", "-q")  # the next session removes it
    assert not any(path.exists() for path in orphaned)


def section(out: str, test: str) -> str:
    """The failure report of `test` in pytest's output."""
    match = re.search(rf"_+ (?:ERROR at setup of )?{test} _+\n(.*?)(?=\n_{{3,}} |\n=+ )", out, re.S)
    assert match, f"no report for {test} in:\n{out}"
    return match.group(1)
