"""The test bed: N nodes as Linux namespaces on one machine, torn down by itself.

`Cluster` builds them (how, and why nothing outlives the bed: namespaces.py), names them and
runs commands on them. Commands run on node k through `nsenter -t <node init> --all` from the
host; on the head the same with the outer init. `run(k, argv)` returns a
`subprocess.CompletedProcess` and never waits past its timeout: then the command's whole process
tree on that node is killed and `NodeTimeout` names the node and the command.

The bed runs no service of its own: Slurm and Open MPI are composed on it by their callers
(`Slurm(bed)`, `OpenMPI(bed)`), torchrun's agents started through it (launch.py). Whatever they
start with `popen` dies with the bed. Its fault hooks: configuration.py (a node's environment,
hosts file, packages) and network.py (interfaces, links, shaping).
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import lockstep_testbed.namespaces as namespaces
from lockstep_testbed.configuration import NodeConfiguration
from lockstep_testbed.errors import BedError, NodeTimeout
from lockstep_testbed.namespaces import HEAD, STATE
from lockstep_testbed.network import LINK_BURST, LINK_RATE, Network
from lockstep_testbed.processes import (
    NodeProcess,
    descendant_nspids,
    first_child,
    read_lines_until,
    tail,
)


class Cluster(NodeConfiguration, Network):
    """N namespace nodes `ls0..ls<N-1>` on one bridge, plus the head `lshead` (the outer
    namespace: where the bridge, the Slurm controller and mpirun live, like a login node).

    `with Cluster(nodes=4) as bed: bed.run(0, ["hostname"])`. Node k's address is
    `bed.address(k)`, its hostname `bed.hostname(k)`; `bed.shared` is a folder every node and
    the host see at the same path (a network filesystem's stand-in); a node's /tmp, /dev/shm
    and /run are its own. Slurm's daemons: `with Slurm(bed) as slurm` (`lockstep_testbed.slurm`);
    Open MPI needs nothing started (`OpenMPI(bed)`, `lockstep_testbed.mpi`). `link_rate`/
    `link_burst` shape every node's link as it starts (`LINK_RATE`; None leaves them unshaped).
    Build it from the thread that keeps it: the parent-death signal that tears it down follows
    the thread that started it.
    """

    def __init__(
        self,
        nodes: int = 4,
        *,
        shared: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        python: str | os.PathLike | None = None,
        prefix: str = "ls",
        start_timeout: float = 20.0,
        link_rate: str | None = LINK_RATE,
        link_burst: str = LINK_BURST,
    ):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes={nodes}: a bed has 1 to 200 nodes")
        self.names = [f"{prefix}{k}" for k in range(nodes)]
        self.head = f"{prefix}head"
        self.python = str(python or sys.executable)
        self.env = dict(env or {})
        self.node_env: dict[str, dict[str, str]] = {n: {} for n in self.names}
        self._ifnames: dict[str, str] = {}  # node -> its renamed interface (default eth0)
        self._overlays: dict[str, list[str]] = {n: [] for n in self.names}  # mount points
        self.net = f"10.{random.randint(16, 250)}.{random.randint(0, 255)}"
        self.start_timeout = start_timeout
        self.link_rate = link_rate
        self.link_burst = link_burst
        self._given_shared = shared
        self.shared = Path(shared) if shared else None
        self._proc: subprocess.Popen | None = None
        self._pids: dict[str, int] = {}  # node name or HEAD -> host pid of its init
        self._outer_pids: dict[str, int] = {}  # node name -> pid in the head's PID namespace
        self._children: list[subprocess.Popen] = []
        self._stderr = None

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Cluster:
        if self._proc is not None:
            raise BedError("bed already started")
        reason = namespaces.missing()
        if reason:
            raise BedError(reason)
        namespaces.reap_stale_shared()
        if self.shared is None:
            self.shared = namespaces.make_shared()
        self.shared.mkdir(parents=True, exist_ok=True)
        self.shared = self.shared.resolve()
        # Root's working folder on every node (`command`'s default cwd): writable by root
        # alone, so no other user can plant a module that root's Python would import (#37).
        os.chmod(self.shared, 0o755)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self._proc = namespaces.start_outer(
            self.names, self.head, self.net, self.shared, self._stderr
        )
        try:
            self._await_ready()
            self.write_profiles()
            if self.link_rate:
                for k in range(len(self.names)):
                    self.rate_limit(k, self.link_rate, self.link_burst)
        except BaseException:
            self.stop()
            raise
        return self

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        lines = read_lines_until(self._proc, "ready", deadline)
        if lines is None:
            self._stderr.seek(0)
            err = self._stderr.read().decode(errors="replace").strip().splitlines()
            raise BedError(
                f"the bed did not come up within {self.start_timeout:g}s "
                f"(outer init exit {self._proc.poll()}): {' | '.join(err[-3:]) or 'no message'}"
            )
        self._outer_pids = {
            parts[1]: int(parts[2]) for parts in (ln.split() for ln in lines) if parts[0] == "node"
        }
        outer = first_child(self._proc.pid, deadline)
        if outer is None:
            raise BedError(f"unshare (pid {self._proc.pid}) did not start the bed's outer init")
        self._pids[HEAD] = outer
        by_outer_pid = {nspid[1]: pid for pid, nspid in descendant_nspids(outer) if len(nspid) > 1}
        for name, opid in self._outer_pids.items():
            if opid not in by_outer_pid:
                raise BedError(f"node {name}: its init (pid {opid} in the bed) not found")
            self._pids[name] = by_outer_pid[opid]

    def stop(self) -> None:
        """Kill every process of the bed, what `popen` started on it included (a service
        composed on the bed may stop its own first), remove the shared folder (when the bed
        made it). Safe to call twice; after it no namespace of the bed is left."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc = None
        for child in self._children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        self._children.clear()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._given_shared is None and self.shared is not None:
            shutil.rmtree(self.shared, ignore_errors=True)
            self.shared = None
        self._pids.clear()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ what the nodes are

    def name(self, k: int | str) -> str:
        """Node k's name (= hostname); "head" (or the head's name) is the head."""
        if k == HEAD or k == self.head:
            return self.head
        if isinstance(k, str):
            if k not in self.names:
                raise BedError(f"no node {k!r} on this bed ({', '.join(self.names)})")
            return k
        if not 0 <= k < len(self.names):
            raise BedError(f"no node {k} on this bed (0..{len(self.names) - 1})")
        return self.names[k]

    def hostname(self, k: int | str) -> str:
        return self.name(k)

    def address(self, k: int | str) -> str:
        name = self.name(k)
        return (
            f"{self.net}.254" if name == self.head else f"{self.net}.{self.names.index(name) + 1}"
        )

    @property
    def subnet(self) -> str:
        return f"{self.net}.0/24"

    def pid(self, k: int | str) -> int:
        """Host pid of node k's init (for `nsenter -t`)."""
        if not self.running:
            raise BedError("the bed is not running")
        name = self.name(k)
        return self._pids[HEAD if name == self.head else name]

    def state_path(self, *parts: str) -> Path:
        """A path of the bed's state folder (/run/lockstep-bed on the head and on every node)
        as the host sees it."""
        return Path(f"/proc/{self.pid(HEAD)}/root{STATE}", *parts)

    # ------------------------------------------------------------------ running commands

    def environ(self, k: int | str, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a command on node k starts with: a clean login-like environment (PATH with the
        bed's Python first, HOME, LANG), the bed's `env`, node k's own variables, then `env`."""
        base = {
            name: value
            for name, value in os.environ.items()
            if name in ("HOME", "LANG", "LC_ALL", "USER", "LOGNAME", "TERM")
        }
        base["PATH"] = os.pathsep.join(
            dict.fromkeys([str(Path(self.python).parent), *os.environ.get("PATH", "").split(":")])
        )
        base.setdefault("HOME", "/root")
        base.setdefault("LANG", "C.UTF-8")
        return {**base, **self.env, **self.node_env.get(self.name(k), {}), **(env or {})}

    def command(self, k: int | str, argv: Sequence[str], cwd: str | os.PathLike | None = None):
        """The host-side argv that runs `argv` on node k (dies with its caller)."""
        wd = str(cwd or self.shared)
        enter = ["nsenter", "-t", str(self.pid(k)), "--all", f"--wd={wd}", "--"]
        return [*enter, "setpriv", "--pdeathsig", "KILL", "--", *map(str, argv)]

    def popen(
        self,
        k: int | str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text: bool = True,
    ) -> NodeProcess:
        """Start `argv` on node k; the bed kills it (and its process tree) on `stop()`."""
        proc = NodeProcess(
            self.command(k, argv, cwd),
            node=self.name(k),
            argv=list(map(str, argv)),
            env=self.environ(k, env),
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            text=text,
            start_new_session=True,
        )
        self._children.append(proc)
        return proc

    def run(
        self,
        k: int | str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        timeout: float = 60.0,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run `argv` on node k and wait at most `timeout` s (then `NodeTimeout` naming the node
        and command, after killing its process tree). stdout and stderr are captured apart."""
        proc = self.popen(
            k,
            argv,
            env=env,
            cwd=cwd,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        )
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill_tree()
            out, err = proc.communicate()
            raise NodeTimeout(
                f"{proc.node}: `{shlex.join(proc.argv)}` did not finish within {timeout:g}s "
                f"(killed); last output: {tail(out or err)}"
            ) from None
        finally:
            self._forget(proc)
        result = subprocess.CompletedProcess(proc.argv, proc.returncode, out, err)
        if check and result.returncode:
            raise BedError(
                f"{proc.node}: `{shlex.join(proc.argv)}` exited {result.returncode}: "
                f"{tail(err or out)}"
            )
        return result

    def run_all(
        self,
        argv: Sequence[str] | Mapping[int, Sequence[str]],
        *,
        nodes: Iterable[int] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> dict[str, subprocess.CompletedProcess]:
        """Start a command on several nodes at once (the same argv, or one per node index) and
        wait for all within `timeout`; `NodeTimeout` names the nodes that did not finish."""
        per_node = dict(argv) if isinstance(argv, Mapping) else None
        which = list(per_node) if per_node else list(nodes or range(len(self.names)))
        procs = {
            k: self.popen(k, per_node[k] if per_node else argv, env=env, stderr=subprocess.PIPE)
            for k in which
        }
        return self.wait_all(procs, timeout)

    def wait_all(
        self, procs: Mapping[int | str, NodeProcess], timeout: float
    ) -> dict[str, subprocess.CompletedProcess]:
        """Wait for processes started with `popen` (stdout and stderr as pipes), all within
        `timeout`; on expiry kill every one and raise `NodeTimeout` naming who was still running."""
        results: dict[str, subprocess.CompletedProcess] = {}

        def collect(proc: NodeProcess) -> None:
            out, err = proc.communicate()
            results[proc.node] = subprocess.CompletedProcess(proc.argv, proc.returncode, out, err)

        threads = [threading.Thread(target=collect, args=(p,), daemon=True) for p in procs.values()]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        late = [p for p in procs.values() if p.poll() is None]
        if late:
            for p in late:
                p.kill_tree()
            for t in threads:
                t.join(5)
            names = ", ".join(f"{p.node} (`{shlex.join(p.argv[:3])} ...`)" for p in late)
            done = "; ".join(
                f"{n} exited {r.returncode}: {tail(r.stdout or r.stderr)}"
                for n, r in sorted(results.items())
                if n not in {p.node for p in late}
            )
            raise NodeTimeout(f"still running after {timeout:g}s, killed: {names}. {done}")
        for p in procs.values():
            self._forget(p)
        return {self.name(k): results[p.node] for k, p in procs.items()}

    def _forget(self, proc: subprocess.Popen) -> None:
        with contextlib.suppress(ValueError):
            self._children.remove(proc)
