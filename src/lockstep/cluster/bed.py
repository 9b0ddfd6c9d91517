"""The test bed: N nodes as Linux namespaces on one machine, torn down by itself.

Layout (everything below lives inside one *outer* namespace set, network + mount + PID + UTS +
IPC, whose first process dies with the process that built the bed):

    host (the test process)
     └─ setpriv --pdeathsig KILL unshare --net --mount --pid --uts --ipc --kill-child   (U)
         └─ outer init, PID 1 of the outer PID namespace = the "head" node `lshead`     (O)
             ├─ bridge `lsbr` (10.A.B.254/24), one veth per node, nothing routed anywhere
             ├─ /run           tmpfs: the bed's own state (/run/lockstep-bed: hosts files,
             │                 node pids, Slurm and munge files, the MPI remote agent)
             ├─ /tmp, /dev/shm tmpfs
             └─ unshare --net --uts --mount --pid --ipc --kill-child --mount-proc  (per node)
                 └─ node init, PID 1 of node k: hostname ls<k>, eth0 = 10.A.B.<k+1>/24,
                    its own /etc/hosts (bind mount of /run/lockstep-bed/nodes/ls<k>/hosts),
                    its own tmpfs /tmp, /dev/shm and /run, /run/lockstep-bed bound back in,
                    and the shared folder bound back at the same path as on the host (so is
                    the software: the venv and the checkout, where they live under /tmp or /run).

When the test process dies (crash, Ctrl-C, SIGKILL) U gets SIGKILL from its parent-death
signal, `--kill-child` kills O, and the kernel kills every process of the outer PID namespace
and of the nodes' namespaces nested in it; the network namespaces (bridge, veths) and mount
namespaces (tmpfs, bind mounts) go with their last process. Nothing was ever created in the
host's namespaces, so two beds (two pytest-xdist workers) never collide on a name or address.
The only host-side file is the shared folder (a temporary directory unless one is given):
`stop()` removes it and `start()` removes those of beds whose process is gone.

Commands run on node k through `nsenter -t <node init> --all` from the host; on the head the
same with the outer init. `run(k, argv)` returns a `subprocess.CompletedProcess` and never
waits past its timeout: then the command's whole process tree on that node is killed and
`NodeTimeout` names the node and the command.
"""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

HEAD = "head"
STATE = "/run/lockstep-bed"  # the bed's state folder, seen at this path on the head and nodes
BRIDGE = "lsbr"
INTERFACE = "eth0"
SHARED_PREFIX = "lockstep-bed-"
_TOOLS = ("unshare", "nsenter", "setpriv", "ip", "tc", "bash", "mount", "hostname")
# Every node's link, shaped as the bed starts (`tc tbf` both ways, see `rate_limit`): a clean
# link's speed is then tc's, the same on every pair, not what this machine's busy cores leave
# (unshaped, preflight's link stage named slow nodes on clean beds). 1 Gbit/s holds on all
# pairs at once on a 2-core machine (clean 8-node links at 0.89-1.01 of their median, 4 nodes
# 0.99-1.01); a burst of 128 KiB passes a veth's 64 KiB GSO packets whole (a smaller one makes
# tbf cut them into MTU packets, at a CPU cost), and preflight's 4 MiB messages are 32 of it.
# None: unshaped.
LINK_RATE: str | None = "1gbit"
LINK_BURST = "128kb"


class BedError(RuntimeError):
    """The bed could not be built, or a command on it failed; the message names the node."""


class NodeTimeout(BedError):
    """A command on a node did not finish in time (its process tree was killed)."""


def unavailable() -> str | None:
    """Why no bed can be built here (one line), or None when it can."""
    if sys.platform != "linux":
        return f"the cluster bed needs Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the cluster bed needs root (network, mount and PID namespaces, veths, a bridge)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the cluster bed needs {', '.join(missing)} (ci/install-cluster.sh installs them)"
    probe = subprocess.run(
        [
            *("unshare", "--net", "--mount", "--pid", "--uts", "--fork", "--kill-child"),
            *("--mount-proc", "sh", "-c"),
            "ip link add lsprobe type bridge && mount -t tmpfs t /tmp",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if probe.returncode:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"cannot create namespaces with a bridge and tmpfs here: {why}"
    return None


_OUTER_INIT = r"""
set -euo pipefail
S=/run/lockstep-bed
eval "$BED_KEEP_OPEN"                      # the shared folder and the software, kept below
mount -t tmpfs -o mode=755 lockstep-bed /run
mount -t tmpfs -o mode=1777 lockstep-tmp /tmp
mount -t tmpfs -o mode=1777 lockstep-shm /dev/shm
eval "$BED_KEEP_BIND"                      # ... bound back at their paths over our tmpfs
mkdir -p "$S/bin" "$S/head/tmp"
hostname "$BED_HEAD"
{
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
  i=1; for n in $BED_NAMES; do printf '%s.%d\t%s\n' "$BED_NET" "$i" "$n"; i=$((i+1)); done
  printf '%s.254\t%s\n' "$BED_NET" "$BED_HEAD"
} >"$S/hosts"
mount --bind "$S/hosts" /etc/hosts
ip link set lo up
ip link add lsbr type bridge
ip addr add "$BED_NET.254/24" dev lsbr
ip link set lsbr up
declare -A launcher
for n in $BED_NAMES; do
  mkdir -p "$S/nodes/$n"
  cp "$S/hosts" "$S/nodes/$n/hosts"
  : >"$S/nodes/$n/profile"
  unshare --net --uts --mount --pid --ipc --fork --kill-child --mount-proc \
    bash -c 'eval "$BED_NODE_INIT"' "lockstep-bed-$n" "$n" </dev/null &
  launcher[$n]=$!
done
i=1
for n in $BED_NAMES; do
  for _ in $(seq 1000); do [ -e "$S/nodes/$n/up" ] && break; sleep 0.005; done
  [ -e "$S/nodes/$n/up" ] || { echo "node $n did not start its init within 5 s" >&2; exit 1; }
  pid=$(cat "/proc/${launcher[$n]}/task/${launcher[$n]}/children")
  pid=${pid%% *}
  echo "$pid" >"$S/nodes/$n/pid"
  ip link add "v$n" type veth peer name eth0 netns "$pid"
  ip link set "v$n" master lsbr up
  nsenter -t "$pid" -n ip -batch - <<EOF
link set lo up
addr add $BED_NET.$i/24 dev eth0
link set eth0 up
EOF
  echo "node $n $pid"
  i=$((i+1))
done
echo ready
exec 1>&- 2>&-
sleep infinity & wait    # PID 1: bash reaps whatever is orphaned to it
while :; do sleep infinity & wait; done
"""

_NODE_INIT = r"""
set -euo pipefail
S=/run/lockstep-bed
n=$1
exec 3<"$S"
eval "$BED_KEEP_OPEN"
mount --bind "$S/nodes/$n/hosts" /etc/hosts
mount -t tmpfs -o mode=1777 "tmp-$n" /tmp
mount -t tmpfs -o mode=1777 "shm-$n" /dev/shm
mount -t tmpfs -o mode=755 "run-$n" /run
mkdir -p "$S" && mount --no-canonicalize --bind /proc/self/fd/3 "$S"
eval "$BED_KEEP_BIND"
exec 3<&-
hostname "$n"
: >"$S/nodes/$n/up"
exec 1>&- 2>&-
while :; do sleep infinity & wait; done
"""


class Cluster:
    """N namespace nodes `ls0..ls<N-1>` on one bridge, plus the head `lshead` (the outer
    namespace: where the bridge, the Slurm controller and mpirun live, like a login node).

    `with Cluster(nodes=4) as bed: bed.run(0, ["hostname"])`. Node k's address is
    `bed.address(k)`, its hostname `bed.hostname(k)`; `bed.shared` is a folder every node and
    the host see at the same path (a network filesystem's stand-in); a node's /tmp, /dev/shm
    and /run are its own. `slurm=True` also starts munged, slurmctld and one slurmd per node
    (`bed.slurm`, see `lockstep.cluster.slurm`); Open MPI needs nothing started
    (`lockstep.cluster.mpi`). `link_rate`/`link_burst` shape every node's link as it starts
    (`LINK_RATE`; None leaves them unshaped). Build it from the thread that keeps it: the parent-death signal
    that tears it down follows the thread that started it.
    """

    def __init__(
        self,
        nodes: int = 4,
        *,
        shared: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        python: str | os.PathLike | None = None,
        slurm: bool = False,
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
        self._want_slurm = slurm
        self.slurm = None
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
        reason = _quick_unavailable()
        if reason:
            raise BedError(reason)
        reap_stale_shared()
        if self.shared is None:
            self.shared = Path(
                tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=_host_tmp())
            )
        self.shared.mkdir(parents=True, exist_ok=True)
        self.shared = self.shared.resolve()
        os.chmod(self.shared, 0o1777)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "BED_NAMES": " ".join(self.names),
            "BED_HEAD": self.head,
            "BED_NET": self.net,
            "BED_SHARED": str(self.shared),
            **_keep_scripts([self.shared, *_software_dirs()]),
            "BED_OUTER_INIT": _OUTER_INIT,
            "BED_NODE_INIT": _NODE_INIT,
        }
        self._proc = subprocess.Popen(
            [
                *("setpriv", "--pdeathsig", "KILL", "--", "unshare", "--net", "--mount", "--pid"),
                *("--uts", "--ipc", "--fork", "--kill-child", "--mount-proc"),
                *("bash", "-c", 'eval "$BED_OUTER_INIT"', f"lockstep-bed-{self.head}"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        try:
            self._await_ready()
            self.write_profiles()
            if self.link_rate:
                for k in range(len(self.names)):
                    self.rate_limit(k, self.link_rate, self.link_burst)
            if self._want_slurm:
                from lockstep.cluster.slurm import Slurm

                self.slurm = Slurm(self)
                self.slurm.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        lines = _read_lines_until(self._proc, "ready", deadline)
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
        outer = _wait_child(self._proc.pid, deadline)
        self._pids[HEAD] = outer
        by_outer_pid = {nspid[1]: pid for pid, nspid in _descendant_nspids(outer) if len(nspid) > 1}
        for name, opid in self._outer_pids.items():
            if opid not in by_outer_pid:
                raise BedError(f"node {name}: its init (pid {opid} in the bed) not found")
            self._pids[name] = by_outer_pid[opid]

    def stop(self) -> None:
        """Stop the daemons, kill every process of the bed, remove the shared folder (when the
        bed made it). Safe to call twice; after it no namespace of the bed is left."""
        if self.slurm is not None:
            with contextlib.suppress(Exception):
                self.slurm.stop()
            self.slurm = None
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

    def interface(self, k: int | str) -> str:
        """The node's interface on the bridge (the head's is the bridge itself)."""
        name = self.name(k)
        return BRIDGE if name == self.head else self._ifnames.get(name, INTERFACE)

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
                f"(killed); last output: {_tail(out or err)}"
            ) from None
        finally:
            self._forget(proc)
        result = subprocess.CompletedProcess(proc.argv, proc.returncode, out, err)
        if check and result.returncode:
            raise BedError(
                f"{proc.node}: `{shlex.join(proc.argv)}` exited {result.returncode}: "
                f"{_tail(err or out)}"
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
        import threading

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
                f"{n} exited {r.returncode}: {_tail(r.stdout or r.stderr)}"
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

    # ------------------------------------------------------------------ fault hooks (phase 2)

    def set_node_env(self, k: int | str, **variables: str) -> None:
        """Variables only node k's commands see (what a node's drifted profile would set):
        `run`/`popen` on the node, the MPI remote agent and Slurm tasks (TaskProlog) there."""
        name = self.name(k)
        self.node_env[name].update(variables)
        self._write_profile(name)

    def _write_profile(self, name: str) -> None:
        """`nodes/<name>/profile`: node's whole environment as shell exports (what the MPI
        remote agent starts a node's daemon with, like a login shell there); `taskenv`: only the
        node's own variables, NAME=value lines (Slurm's TaskProlog exports them to its tasks)."""
        if not self.running:
            return
        env = self.environ(name)
        self.state_path("nodes", name, "profile").write_text(
            "".join(f"export {n}={shlex.quote(v)}\n" for n, v in sorted(env.items()))
        )
        self.state_path("nodes", name, "taskenv").write_text(
            "".join(f"{n}={v}\n" for n, v in self.node_env[name].items())
        )

    def write_profiles(self) -> None:
        for name in self.names:
            self._write_profile(name)

    def hosts(self, k: int | str) -> str:
        """Node k's /etc/hosts."""
        return self.state_path("nodes", self.name(k), "hosts").read_text()

    def write_hosts(self, k: int | str, text: str) -> None:
        """Replace node k's /etc/hosts (in place: the node's bind mount sees it at once)."""
        with open(self.state_path("nodes", self.name(k), "hosts"), "r+") as f:
            f.truncate(0)
            f.write(text)

    def drop_host(self, k: int | str, hostname: str) -> None:
        """Remove `hostname` from node k's /etc/hosts (it then no longer resolves there)."""
        keep = [
            ln for ln in self.hosts(k).splitlines(keepends=True) if hostname not in ln.split()[1:]
        ]
        self.write_hosts(k, "".join(keep))

    def ip(self, k: int | str, *args: str, timeout: float = 10.0) -> str:
        """`ip ARGS` in node k's network namespace (on the head: where the bridge and the
        nodes' veths `v<name>` live)."""
        return self.run(k, ["ip", *args], timeout=timeout, check=True).stdout

    def tc(self, k: int | str, *args: str, timeout: float = 10.0) -> str:
        return self.run(k, ["tc", *args], timeout=timeout, check=True).stdout

    def rename_interface(self, k: int | str, new: str) -> None:
        """Rename node k's eth0 (a node whose NIC is named differently)."""
        old = self.interface(k)
        self.ip(k, "link", "set", old, "down")
        self.ip(k, "link", "set", old, "name", new)
        self.ip(k, "link", "set", new, "up")
        self.ip(k, "route", "replace", self.subnet, "dev", new)
        self._ifnames[self.name(k)] = new

    def overlay_package(self, k: int | str, name: str, version: str) -> str:
        """Make node k see distribution `name` at `version` (a node whose venv drifted): a
        copy of its `.dist-info` with that Version, bind-mounted over the original in node
        k's mount namespace only; `importlib.metadata` (and lockstep's fingerprint) there
        reads the new version, every other node the real one. Returns the dist-info path;
        `remove_overlays(k)` undoes it."""
        node = self.name(k)
        where = subprocess.run(
            [
                self.python,
                "-c",
                "import importlib.metadata as m, sys; print(m.distribution(sys.argv[1])._path)",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if where.returncode:
            raise BedError(f"{node}: no distribution {name!r} in {self.python}")
        original = Path(where.stdout.strip())
        copy = self.state_path("nodes", node, "overlay", original.name)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(original, copy)
        for meta in ("METADATA", "PKG-INFO"):
            path = copy / meta
            if path.exists():
                head, sep, body = path.read_text().partition("\n\n")
                lines = [
                    f"Version: {version}" if ln.startswith("Version: ") else ln
                    for ln in head.splitlines()
                ]
                path.write_text("\n".join(lines) + sep + body)
        inside = f"{STATE}/nodes/{node}/overlay/{original.name}"
        self.run(k, ["mount", "--bind", inside, str(original)], check=True, timeout=10)
        self._overlays[node].append(str(original))
        return str(original)

    def remove_overlays(self, k: int | str) -> None:
        node = self.name(k)
        while self._overlays[node]:
            self.run(k, ["umount", self._overlays[node].pop()], check=True, timeout=10)

    def link(self, k: int | str, up: bool) -> None:
        """Take node k's link to the bridge down or up (its veth on the head's side)."""
        self.ip(HEAD, "link", "set", f"v{self.name(k)}", "up" if up else "down")

    def rate_limit(self, k: int | str, rate: str = "10mbit", burst: str = "32kbit") -> None:
        """Rate-limit node k's traffic both ways with `tc tbf` (netem does not exist here)."""
        for where, dev in ((k, self.interface(k)), (HEAD, f"v{self.name(k)}")):
            self.tc(
                where,
                *("qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate),
                *("burst", burst, "latency", "50ms"),
            )

    def clear_rate_limit(self, k: int | str) -> None:
        """Undo `rate_limit(k)` (or `rate_limit_pair`): node k's link back to the bed's own
        shaping (`link_rate`), or unshaped."""
        if self.link_rate:
            self.rate_limit(k, self.link_rate, self.link_burst)
            return
        for where, dev in ((k, self.interface(k)), (HEAD, f"v{self.name(k)}")):
            self.run(where, ["tc", "qdisc", "del", "dev", dev, "root"], timeout=10)

    def tcp_peers(self, k: int | str) -> list[tuple[int, str, int]]:
        """Node k's established TCP connections as (local port, peer address, peer port),
        from /proc/net/tcp in its network namespace."""
        out = []
        for line in self.run(k, ["cat", "/proc/net/tcp"], timeout=10).stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "01":  # 01: ESTABLISHED
                continue
            local, peer = fields[1], fields[2]
            addr = ".".join(str(int(peer[i : i + 2], 16)) for i in (6, 4, 2, 0))
            out.append((int(local.split(":")[1], 16), addr, int(peer.split(":")[1], 16)))
        return out

    def rate_limit_pair(
        self,
        a: int | str,
        b: int | str,
        rate: str,
        *,
        others: str = "10gbit",
        burst: str = "64kb",
    ) -> None:
        """Slow the link between nodes a and b only: on each one's interface an `htb` root whose
        default class carries its other traffic at `others` and a class at `rate` that a u32
        filter on the peer's address feeds (replaces a `rate_limit` on those interfaces; the
        head's side keeps its own)."""
        for me, peer in ((a, b), (b, a)):
            dev = self.interface(me)
            shown = self.tc(me, "qdisc", "show", "dev", dev)
            if "qdisc tbf" in shown or "qdisc htb" in shown:
                self.tc(me, "qdisc", "del", "dev", dev, "root")
            self.tc(me, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
            for cls, speed in (("1:10", others), ("1:20", rate)):
                self.tc(
                    me,
                    *("class", "add", "dev", dev, "parent", "1:", "classid", cls, "htb"),
                    *("rate", speed, "ceil", speed, "burst", burst, "cburst", burst),
                )
            self.tc(
                me,
                *("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1"),
                *("u32", "match", "ip", "dst", f"{self.address(peer)}/32", "flowid", "1:20"),
            )


class NodeProcess(subprocess.Popen):
    """A process started on a node: `node` names it, `kill_tree()` kills it and everything it
    started there (the host sees every pid of the bed)."""

    def __init__(self, args, *, node: str, argv: list[str], **kwargs):
        self.node = node
        self.argv = argv
        super().__init__(args, **kwargs)

    def kill_tree(self) -> None:
        for _ in range(3):
            pids = _descendants(self.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.kill()


def reap_stale_shared() -> None:
    """Remove shared folders left by beds whose process died without `stop()` (SIGKILL)."""
    tmp = Path(_host_tmp())
    for path in tmp.glob(f"{SHARED_PREFIX}*-*"):
        try:
            pid = int(path.name[len(SHARED_PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _host_tmp() -> str:
    return tempfile.gettempdir()


# What the bed mounts a private tmpfs over, in the outer namespace and in every node.
_MASKED = (Path("/tmp"), Path("/dev/shm"), Path("/run"))


def _software_dirs() -> list[Path]:
    """Where the interpreter, its venv and lockstep's source live: a checkout or venv under
    /tmp (a fresh clone in CI) must stay visible inside the nodes, at the same path."""
    import lockstep

    package = Path(lockstep.__file__).resolve().parent
    source = package.parent.parent if package.parent.name == "src" else package.parent
    dirs = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), source}
    return sorted(d for d in dirs if any(d == m or m in d.parents for m in _MASKED))


def _keep_scripts(dirs: list[Path]) -> dict[str, str]:
    """Shell that opens each of `dirs` before the private tmpfs mounts hide it
    (BED_KEEP_OPEN) and binds it back at its own path afterwards (BED_KEEP_BIND)."""
    opened, bound = [], []
    for i, path in enumerate(dict.fromkeys(str(d) for d in dirs)):
        fd = 10 + i
        quoted = shlex.quote(path)
        opened.append(f"exec {fd}<{quoted}")
        bound.append(
            f"mkdir -p {quoted} && mount --no-canonicalize --bind /proc/self/fd/{fd} {quoted}"
            f" && exec {fd}<&-"
        )
    return {"BED_KEEP_OPEN": "\n".join(opened), "BED_KEEP_BIND": "\n".join(bound)}


def _quick_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the cluster bed needs root (network, mount and PID namespaces, veths, a bridge)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the cluster bed needs {', '.join(missing)} (ci/install-cluster.sh installs them)"
    return None


def _read_lines_until(proc: subprocess.Popen, last: str, deadline: float) -> list[str] | None:
    """Lines of `proc`'s stdout up to the line `last`, or None at EOF or the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf, lines = b"", []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                text = line.decode()
                if text == last:
                    return lines
                lines.append(text)
    finally:
        sel.close()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return out


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _nspid(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def _descendant_nspids(pid: int) -> list[tuple[int, list[int]]]:
    return [(p, _nspid(p)) for p in _descendants(pid)]


def _wait_child(pid: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        kids = _children(pid)
        if kids:
            return kids[0]
        time.sleep(0.005)
    raise BedError(f"unshare (pid {pid}) did not start the bed's outer init")


def _tail(text: str | None, n: int = 300) -> str:
    text = (text or "").strip()
    return ("..." + text[-n:]) if len(text) > n else (text or "(no output)")
