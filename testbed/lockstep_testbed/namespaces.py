"""How the bed is built: the namespaces, the init scripts that set them up, and what the host
checks and cleans before and after (the bed itself, `Cluster`, is bed.py).

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
`Cluster.stop()` removes it and `Cluster.start()` removes those of beds whose process is
gone (`reap_stale_shared`).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HEAD = "head"
STATE = "/run/lockstep-bed"  # the bed's state folder, seen at this path on the head and nodes
BRIDGE = "lsbr"
INTERFACE = "eth0"
SHARED_PREFIX = "lockstep-bed-"
TOOLS = ("unshare", "nsenter", "setpriv", "ip", "tc", "bash", "mount", "hostname")
# What the bed mounts a private tmpfs over, in the outer namespace and in every node.
MASKED = (Path("/tmp"), Path("/dev/shm"), Path("/run"))


def missing() -> str | None:
    """Why no bed can be built here without trying (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "the cluster bed needs root (network, mount and PID namespaces, veths, a bridge)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"the cluster bed needs {', '.join(absent)} (ci/install-cluster.sh installs them)"
    return None


def unavailable() -> str | None:
    """Why no bed can be built here (one line), or None when it can: `missing()`, then a
    probe that creates the namespaces, a bridge and a tmpfs once."""
    if sys.platform != "linux":
        return f"the cluster bed needs Linux namespaces (this is {sys.platform})"
    reason = missing()
    if reason:
        return reason
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


OUTER_INIT = r"""
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

NODE_INIT = r"""
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


def start_outer(names: list[str], head: str, net: str, shared: Path, stderr) -> subprocess.Popen:
    """Start the outer namespace set and its init (`OUTER_INIT`), which builds the nodes and
    prints `node <name> <pid>` lines, then `ready`. Its stdout is a pipe; it gets SIGKILL when
    the calling thread ends (`setpriv --pdeathsig`), and the kernel then takes the rest."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "BED_NAMES": " ".join(names),
        "BED_HEAD": head,
        "BED_NET": net,
        "BED_SHARED": str(shared),
        **keep_scripts([shared, *software_dirs()]),
        "BED_OUTER_INIT": OUTER_INIT,
        "BED_NODE_INIT": NODE_INIT,
    }
    return subprocess.Popen(
        [
            *("setpriv", "--pdeathsig", "KILL", "--", "unshare", "--net", "--mount", "--pid"),
            *("--uts", "--ipc", "--fork", "--kill-child", "--mount-proc"),
            *("bash", "-c", 'eval "$BED_OUTER_INIT"', f"lockstep-bed-{head}"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )


def make_shared() -> Path:
    """A new shared folder, named after this process (`reap_stale_shared` reads the pid)."""
    return Path(tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=host_tmp()))


def reap_stale_shared() -> None:
    """Remove shared folders left by beds whose process died without `stop()` (SIGKILL)."""
    tmp = Path(host_tmp())
    for path in tmp.glob(f"{SHARED_PREFIX}*-*"):
        try:
            pid = int(path.name[len(SHARED_PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def host_tmp() -> str:
    return tempfile.gettempdir()


def software_dirs() -> list[Path]:
    """Where the interpreter, its venv, lockstep's source and this checkout live: a checkout or
    venv under /tmp (a fresh clone in CI) must stay visible inside the nodes, at the same path.
    lockstep is found, not imported: the bed drives it only as a program."""
    dirs = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    dirs.add(Path(__file__).resolve().parents[2])  # the checkout holding testbed/
    spec = importlib.util.find_spec("lockstep")
    if spec and spec.origin:
        package = Path(spec.origin).resolve().parent  # lockstep/
        dirs.add(package.parent.parent if package.parent.name == "src" else package.parent)
    return sorted(d for d in dirs if any(d == m or m in d.parents for m in MASKED))


def keep_scripts(dirs: list[Path]) -> dict[str, str]:
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
