"""`lockstep preflight`'s ranks started by hand, as a launcher would: RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in each one's environment, every other launcher variable
removed. Each rank is forked from this process's forkserver, which imported torch once
(`ForkedRank`); what a new interpreter's start would have done for it (its PYTHONPATH, a host
of its own, a launcher script's import) the fork does itself."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from lockstep.launch import free_port

LAUNCH_TIMEOUT_S = 240
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "CROSS_RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "GITHUB_STEP_SUMMARY",
)


def endpoint_port() -> int:
    """A port P for `--rdzv-endpoint` whose P+1 (node 0's check-in store) is free too, both
    below the kernel's ephemeral range. `free_port()`'s P is one that bind(0) hands out (odd
    here); P+1 is then one that connect() gives outgoing connections (even), and one held
    there, open or in TIME_WAIT, makes node 0's bind fail ("cannot serve the check-in"): the
    likely cause of CI's failure of 2026-11-27 (the forger never connected; a whole tier holds
    about 50 such ports at a time). Below the range only another explicit bind can take it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(max(1024, low - 10000), low - 1)
        if _bindable(port) and _bindable(port + 1):
            return port
    raise RuntimeError(f"no free pair of ports below {low} after 200 tries")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(COLUMNS="400", PYTHONUNBUFFERED="1", **extra)
    return env


def _as_started(hostname: str | None) -> None:
    """What an interpreter's start, or the command in front of it, would have done for this
    forked rank: the PYTHONPATH of its environment first on sys.path (where the interpreter's
    start puts it: a site of the rank's own is found by importlib.metadata), and with
    `hostname`, a UTS namespace of its own under that name (`unshare --uts` then `hostname`)."""
    import importlib

    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    importlib.invalidate_caches()
    if hostname:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        name = hostname.encode()
        if libc.unshare(0x04000000) or libc.sethostname(name, len(name)):  # CLONE_NEWUTS
            raise OSError(ctypes.get_errno(), f"a UTS namespace named {hostname}")


def _preflight(cwd: str, args: list[str], hostname=None, preload=None) -> None:
    """On a forked rank: `python -m lockstep preflight ARGS` in `cwd`, as `lockstep.__main__`
    runs it, after importing `preload` from `cwd` where given (what a launcher script of the
    job's own imports before it calls `main`); the atexit handlers run as an interpreter's
    exit would run them (the rank ends with `os._exit`)."""
    import atexit
    import importlib

    from lockstep.cli import main

    _as_started(hostname)
    os.chdir(cwd)
    if preload:
        sys.path.insert(0, cwd)
        importlib.import_module(preload)
    sys.argv = [sys.argv[0], "preflight", *args]
    try:
        code = main(["preflight", *args])
    finally:
        atexit._run_exitfuncs()
    raise SystemExit(code)


class Forked:
    """`fn(*args)` in a process forked from this process's forkserver (torch imported once:
    `lockstep.launch.forkserver_context`) instead of a new interpreter, with `env` as its
    environment (`forkserver.in_environ`). Behind the part of Popen's interface these tests
    use: text pipes for stdout and stderr, pid, poll, wait, kill, communicate, returncode;
    `name`: the argv that stands for it in a timeout's message."""

    def __init__(self, name: list[str], env: dict[str, str], fn, *args):
        from lockstep.launch import forkserver_context
        from lockstep.launch.forkserver import Launcher, in_environ, start_forkserver

        self.args = name
        context, server = forkserver_context(), start_forkserver()
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            launcher = Launcher(server, env, streams=(out_w, err_w))
            self._process = context.Process(target=in_environ, args=(launcher, fn, *args))
            self._process.start()
        finally:
            os.close(out_w), os.close(err_w)
        self.pid = self._process.pid
        self.stdout = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr = open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both streams to their end, then the exit (Popen's `communicate`)."""
        got: dict[str, str] = {}
        readers = [
            threading.Thread(target=lambda n=n, f=f: got.__setitem__(n, f.read()), daemon=True)
            for n, f in (("out", self.stdout), ("err", self.stderr))
        ]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.stdout.close(), self.stderr.close()
        return got["out"], got["err"]


class ForkedRank(Forked):
    """One `python -m lockstep preflight` rank, forked (`Forked`): the same `lockstep.cli.main`
    with the same environment, arguments and folder, about 1.3 CPU-s less a rank here than a
    new interpreter. `hostname`: the rank runs on a host of its own by that name
    (`_as_started`); `preload`: a module it imports first."""

    def __init__(self, args, env: dict[str, str], cwd: Path, hostname=None, preload=None):
        name = ["lockstep", "preflight", *args]
        super().__init__(name, env, _preflight, str(cwd), list(args), hostname, preload)


def by_hand(
    world: int,
    ranks,
    cwd: Path,
    args=(),
    per_rank_env=None,
    per_rank_args=None,
    per_rank_host=None,
    preload=None,
):
    """Start `python -m lockstep preflight` for `ranks` with RANK/WORLD_SIZE/MASTER_*, each a
    `ForkedRank`; `per_rank_host`: rank -> the hostname of a host of its own (a UTS
    namespace); `preload`: a module of the job's own, in `cwd`, that every rank imports before
    `main` (as a launcher script of the job's would)."""
    port, procs = free_port(), {}
    envs, hosts = per_rank_env or {}, per_rank_host or {}
    for rank in ranks:
        env = base_env(
            RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        env.update(envs.get(rank, {}))
        rest = [*args, *(per_rank_args or {}).get(rank, [])]
        procs[rank] = ForkedRank(rest, env, cwd, hosts.get(rank), preload)
    return port, procs


def on_nodes(per_node: int, run_id: str, ranks) -> dict[int, dict[str, str]]:
    """Per-rank variables that put `ranks` on nodes of `per_node` as torchrun's agents would
    (node rank, local rank and size, its run id), without the agents: rank 0 serves the store."""
    return {
        r: {
            "TORCHELASTIC_RUN_ID": run_id,
            "GROUP_RANK": str(r // per_node),
            "LOCAL_RANK": str(r % per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
        }
        for r in ranks
    }


def wait_served(port: int, within_s: float) -> float:
    """When rank 0's store starts listening: the moment its check-in clock starts."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return time.monotonic()
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"rank 0 never served its store on port {port}")


def finish(procs: dict) -> dict:
    out = {}
    for rank, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        out[rank] = {"rc": proc.returncode, "out": stdout, "err": stderr}
    return out


def stores_of(port: int, within_s: float, run: str = "."):
    """A running job's two stores, read from outside (issue 38): (lockstep's store at
    MASTER_PORT, the process group's store that the check-in's answer names). `run`: the
    job's run id (by hand: no Slurm or torchrun ids)."""
    from datetime import timedelta

    import torch.distributed as dist

    from lockstep.preflight.store import Store

    wait_served(port, within_s)
    raw = dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=True,
                        timeout=timedelta(seconds=within_s))  # fmt: skip
    protocol = Store(raw).prefixed(f"lockstep/preflight/{run}")
    deadline = time.monotonic() + within_s
    while not protocol.has("checkin/answer"):
        assert time.monotonic() < deadline, "rank 0 posted no check-in answer"
        time.sleep(0.05)
    where = protocol.get("checkin/answer")["v"]["pg"]
    group = dist.TCPStore(where["host"], where["port"], is_master=False, use_libuv=True,
                          timeout=timedelta(seconds=within_s))  # fmt: skip
    return raw, group
