"""Warm pools of rank processes, reused by every test with the same world size and backend; a
pool that saw a failure, a crash or a hang is killed. Design: docs/design/pytest-plugin.md.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path

import psutil

from lockstep.errors import LockstepError, RankTimeout
from lockstep.launch.cleanup import orphaned_tempdirs, owned_tempdir
from lockstep.testing import worker
from lockstep.testing.worker import FAILED, PASSED, SKIPPED, XFAILED, Outcome, Task

DIED, HUNG = "died", "hung"
# The others' time to report after a rank fails: they usually wait in a collective for it.
FAILURE_GRACE_S = 3.0
STACKS_WAIT_S = 2.0
DIR_PREFIX = "lockstep-pool-"  # then the pytest process's pid
MAX_IDLE_RANKS = 8  # in idle pools; the least recently used are stopped first


class RankPool:
    """`world_size` rank processes in one default process group, ready to run tests."""

    def __init__(self, world_size: int, backend: str, start_timeout: float):
        self.world_size, self.backend, self.closed = world_size, backend, False
        self.dir = Path(owned_tempdir(DIR_PREFIX, f"{world_size}-"))
        # nccl ranks are never forked
        from lockstep.launch import forkserver_context, free_port

        if backend == "gloo":
            context = forkserver_context()
        else:
            context = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        _live_pools.add(self)
        master_port = free_port()  # for the test's own use
        for rank in range(world_size):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            }
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=worker.main,
                args=(
                    theirs,
                    rank,
                    world_size,
                    backend,
                    str(self.dir),
                    env,
                    os.getpid(),
                    dict(os.environ),
                ),
                name=f"lockstep-rank-{rank}",
            )
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(proc)
        self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> None:
        outcomes = self._collect(lambda rank: None, timeout, grace=0.0)
        errors = [o for o in outcomes if o.status != PASSED]
        if errors:
            self.close()
            lines = [f"could not start {self.world_size} ranks ({self.backend}):"]
            lines += [f"rank {o.rank} {o.status}: {o.message}\n{o.output}" for o in errors]
            error_class = RankTimeout if all(o.status == HUNG for o in errors) else LockstepError
            raise error_class("\n".join(lines))

    def alive(self) -> bool:
        return all(proc.is_alive() for proc in self.procs)

    def run(self, task: Task, timeout: float) -> list[Outcome]:
        """Each rank's outcome of `task`, with its output, in rank order."""
        outcomes = self._collect(lambda rank: self.conns[rank].send(task), timeout, FAILURE_GRACE_S)
        if not all(o.status in (PASSED, SKIPPED, XFAILED) and o.pool_intact for o in outcomes):
            self.close()
        return outcomes

    def _collect(self, send, timeout: float, grace: float) -> list[Outcome]:
        """Send to every rank, then wait for each answer, death or the deadline."""
        outcomes: dict[int, Outcome] = {}
        for rank in range(self.world_size):
            try:
                send(rank)
            except OSError:  # it died; its sentinel says so below
                pass
        deadline, cut_short = time.monotonic() + timeout, False
        while len(outcomes) < self.world_size:
            waiting = {}
            for rank in set(range(self.world_size)) - outcomes.keys():
                waiting[self.conns[rank]] = waiting[self.procs[rank].sentinel] = rank
            ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for rank in {waiting[obj] for obj in ready}:
                outcomes[rank] = self._receive(rank)
                if outcomes[rank].status != PASSED and not cut_short:
                    cut_short = time.monotonic() + grace < deadline
                    deadline = min(deadline, time.monotonic() + grace)
        hung = sorted(set(range(self.world_size)) - outcomes.keys())
        collectives = self._collectives() if hung else ""
        stacks = self._stacks(hung)
        for rank in hung:
            if cut_short:
                why = f"was still running {grace:g} s after another rank failed"
            else:
                why = f"did not finish within the {timeout:g} s timeout"
            message = f"{why}; its Python stack:\n{stacks[rank] or '(none: not responding)'}"
            message += collectives if rank == hung[0] else ""  # once, with the first
            outcomes[rank] = Outcome(rank, HUNG, message, pool_intact=False)
        result = [
            replace(outcomes[rank], output=self._read(worker.log_path(self.dir, rank)))
            for rank in range(self.world_size)
        ]
        if hung:
            self.close()
        return result

    def _receive(self, rank: int) -> Outcome:
        conn = self.conns[rank]
        try:
            if conn.poll(0):
                answer = conn.recv()
                # at start-up: None when ready, or a traceback
                if answer is None:
                    return Outcome(rank, PASSED)
                return answer if isinstance(answer, Outcome) else Outcome(rank, FAILED, answer)
        except (EOFError, OSError):
            pass
        proc = self.procs[rank]
        proc.join(timeout=5)
        code = proc.exitcode
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            how = f"was killed by signal {_signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        crash = self._read(worker.stacks_path(self.dir, rank)).strip()
        message = f"{how}" + (f"; its last Python stack:\n{crash}" if crash else "")
        return Outcome(rank, DIED, message, pool_intact=False)

    def _collectives(self) -> str:
        """The flight recorder's report on every rank; '' when no rank answered."""
        from lockstep.forensics import collect, hang

        folder = worker.fr_path(self.dir)
        if not folder.is_dir():
            return ""
        collect.request(folder, self.world_size, wait=STACKS_WAIT_S)
        report = hang.report(folder, world=self.world_size)
        if not report.versions:
            return ""
        return "\nflight recorder:\n" + "\n".join(f"  {ln}" for ln in report.lines())

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every thread's Python stack of each rank in `ranks` (faulthandler)."""
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, worker.STACKS_SIGNAL)
            except ProcessLookupError:
                pass
        paths = {rank: worker.stacks_path(self.dir, rank) for rank in ranks}
        sizes: dict[int, int] = {}
        deadline = time.monotonic() + STACKS_WAIT_S
        while ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            now = {rank: _size(path) for rank, path in paths.items()}
            if all(now.values()) and now == sizes:  # every dump written, no longer growing
                break
            sizes = now
        return {rank: _user_frames(self._read(path)) for rank, path in paths.items()}

    def close(self) -> None:
        """Kill every rank and what it started; remove the pool's directory."""
        if self.closed:
            return
        self.closed = True
        _live_pools.discard(self)
        descendants = []
        for proc in self.procs:
            if proc.exitcode is None:
                try:
                    descendants += psutil.Process(proc.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    pass
                proc.kill()
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # a rank leads its own process group
            except OSError:
                pass
        for descendant in descendants:  # those that left the rank's process group
            try:
                descendant.kill()
            except psutil.NoSuchProcess:
                pass
        for proc, conn in zip(self.procs, self.conns, strict=True):
            proc.join(timeout=5)
            conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""


class Pools:
    """The warm pools of one pytest process, one per (world size, backend)."""

    def __init__(self, start_timeout: float, reuse: bool):
        self.start_timeout, self.reuse = start_timeout, reuse
        self._pools: dict[tuple[int, str], RankPool] = {}  # least recently used first
        _remove_orphaned_dirs()

    def run(self, world_size: int, backend: str, task: Task, timeout: float) -> list[Outcome]:
        key = (world_size, backend)
        pool = self._pools.pop(key, None)
        if pool is None or not pool.alive():
            if pool is not None:
                pool.close()
            while self._pools and sum(k[0] for k in self._pools) + world_size > MAX_IDLE_RANKS:
                self._pools.pop(next(iter(self._pools))).close()
            pool = RankPool(world_size, backend, self.start_timeout)
        try:
            return pool.run(task, timeout)
        finally:
            if self.reuse and pool.alive():
                self._pools[key] = pool
            else:
                pool.close()

    def close(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()


def _remove_orphaned_dirs() -> None:
    """Remove the directories of pools whose pytest process was killed."""
    for path in orphaned_tempdirs(DIR_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _user_frames(stacks: str) -> str:
    """A faulthandler dump without the rank machinery's frames."""
    machinery = (
        f'File "{worker.__file__}"',
        f'File "{os.path.dirname(multiprocessing.__file__)}',
        'File "<string>"',
    )
    return "\n".join(
        line for line in stacks.strip().splitlines() if not line.strip().startswith(machinery)
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return str(number)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


_live_pools: set[RankPool] = set()


@atexit.register
def _close_live_pools() -> None:
    """When pytest exits without unconfiguring (multiprocessing would wait on the ranks)."""
    for pool in list(_live_pools):
        pool.close()
