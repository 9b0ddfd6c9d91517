"""Real Open MPI on the bed: `mpirun` on the head, its daemons (orted) on the nodes.

Open MPI starts one orted per host through its remote agent (`plm_rsh_agent`, normally ssh).
On the bed the agent is `lockstep-rsh`, a script in the bed's state folder that enters the
node's namespaces (`nsenter -t <node init> --all`) instead, and starts the daemon with the
node's environment (`nodes/<name>/profile`: a login shell's view of that node, with what
`Cluster.set_node_env` planted), the way ssh would; `OpenMPI.block_agent` makes it fail for one
node as ssh does for a node it cannot reach. TCP only, on the bed's subnet. The bed knows nothing
of it: callers compose `OpenMPI(bed)`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lockstep_testbed.namespaces import HEAD, STATE

if TYPE_CHECKING:
    from lockstep_testbed.bed import Cluster

AGENT = f"{STATE}/bin/lockstep-rsh"
TOOLS = ("mpirun", "orted")

_AGENT = f"""#!/bin/sh
# Open MPI's remote agent on the lockstep test bed: what ssh would do, by entering the node's
# namespaces. Called as `lockstep-rsh [ssh options] HOST COMMAND...` from the head.
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
host=$1
shift
if [ ! -r "{STATE}/nodes/$host/pid" ]; then
	echo "lockstep-rsh: no node $host on this bed" >&2
	exit 255
fi
if [ -e "{STATE}/nodes/$host/unreachable" ]; then
	echo "lockstep-rsh: connect to host $host: Connection refused (planted: block_agent)" >&2
	exit 255
fi
pid=$(cat "{STATE}/nodes/$host/pid")
exec nsenter -t "$pid" --all --wd=/ -- env -i /bin/sh -c ". {STATE}/nodes/$host/profile; $*"
"""


def version() -> str:
    """`4.1.4`."""
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].split()[-1] if out else "unknown"


class OpenMPI:
    """Open MPI on a bed, composed by its caller (`OpenMPI(bed).mpirun(argv, per_node=2)`):
    nothing runs between jobs; each mpirun starts its daemons through the agent, and they end
    with it (or with the bed)."""

    def __init__(self, bed: Cluster):
        self.bed = bed

    def install_agent(self) -> str:
        """Write the remote agent (and every node's profile) into the bed's state folder;
        returns its path there (`mpirun_command` names it)."""
        path = self.bed.state_path("bin", "lockstep-rsh")
        path.write_text(_AGENT)
        os.chmod(path, 0o755)
        self.bed.write_profiles()
        return AGENT

    def block_agent(self, k: int | str, blocked: bool = True) -> None:
        """Make the remote agent fail for node k as ssh does for a node it cannot reach (exit
        255, one line on stderr) until `block_agent(k, False)`: a node where Open MPI's daemon
        never starts."""
        path = self.bed.state_path("nodes", self.bed.name(k), "unreachable")
        if blocked:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def mpirun_command(
        self,
        argv: Sequence[str],
        *,
        per_node: int = 1,
        nodes: Sequence[int] | None = None,
        export: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> list[str]:
        bed = self.bed
        which = list(range(len(bed.names))) if nodes is None else list(nodes)
        hosts = ",".join(f"{bed.hostname(k)}:{per_node}" for k in which)
        cmd = ["mpirun", "--allow-run-as-root", "-H", hosts, "-np", str(per_node * len(which))]
        cmd += ["--mca", "plm_rsh_agent", AGENT]
        cmd += ["--bind-to", "none", "--mca", "btl", "self,vader,tcp"]
        cmd += ["--mca", "btl_tcp_if_include", bed.subnet]
        cmd += ["--mca", "oob_tcp_if_include", bed.subnet]
        for name in export:
            cmd += ["-x", name]
        return [*cmd, *extra, *map(str, argv)]

    def mpirun(
        self,
        argv: Sequence[str],
        *,
        per_node: int = 1,
        nodes: Sequence[int] | None = None,
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess:
        """`mpirun -H ls0:<per_node>,... argv` from the head. Each rank starts from its node's
        environment; `env` is set for mpirun and forwarded to every rank with `-x`."""
        self.install_agent()
        cmd = self.mpirun_command(
            argv, per_node=per_node, nodes=nodes, export=sorted(env or {}), extra=extra
        )
        return self.bed.run(HEAD, cmd, env=env, timeout=timeout)
