"""Real Slurm on the bed: one munged and slurmctld on the head, one slurmd per node namespace.

Debian's slurm-wlm and munge (ci/install-cluster.sh), no cgroups, no system configuration:
everything lives in the bed's state folder (/run/lockstep-bed/slurm, /run/lockstep-bed/munge,
seen on the head and on every node) or in a node's own /run (slurmd's spool and pid file).
`ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, `SlurmUser=root`. One munge key,
one munged whose socket every node reaches through the shared state folder.

A node's own variables (`Cluster.set_node_env`) reach the tasks Slurm starts there through a
TaskProlog, as a node's drifted configuration would.

Composed on a bed by its caller, the bed knows nothing of it:

    with Cluster(4) as bed, Slurm(bed) as slurm:
        slurm.srun(argv, nodes=4, ntasks_per_node=2)   # from the head (a login node)

`srun` returns its CompletedProcess. The daemons are the bed's processes (`bed.popen`): `stop()`
ends them first, and whatever ends the bed, a crash or SIGKILL included, ends them with it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lockstep_testbed.errors import BedError, NodeTimeout
from lockstep_testbed.namespaces import HEAD, STATE
from lockstep_testbed.processes import NodeProcess, tail

if TYPE_CHECKING:
    from lockstep_testbed.bed import Cluster

CONF = f"{STATE}/slurm/slurm.conf"
MUNGE_SOCKET = f"{STATE}/munge/munge.socket.2"
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")


def version() -> str:
    """`slurm-wlm 22.05.8`."""
    return subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip()


class Slurm:
    """munged and slurmctld on the bed's head, one slurmd per node, for the `with` block (or
    from `start()` to `stop()`); `env` is what a Slurm command needs (`SLURM_CONF`)."""

    def __init__(self, bed: Cluster, *, cpus_per_node: int = 8, ready_timeout: float = 20.0):
        self.bed = bed
        self.cpus = cpus_per_node
        self.ready_timeout = ready_timeout
        self.daemons: dict[str, NodeProcess] = {}
        self.env = {"SLURM_CONF": CONF}

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Slurm:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start the daemons and wait until every node is idle; on any failure stop those
        already started, then raise."""
        try:
            self._start_daemons()
        except BaseException:
            self.stop()
            raise

    def _start_daemons(self) -> None:
        bed = self.bed
        self._write_files()
        self.daemons["munged"] = bed.popen(
            HEAD,
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={MUNGE_SOCKET}",
                f"--key-file={STATE}/munge/munge.key",
                f"--pid-file={STATE}/munge/munged.pid",
                f"--log-file={STATE}/munge/munged.log",
                f"--seed-file={STATE}/munge/munged.seed",
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._await(lambda: bed.state_path("munge", "munge.socket.2").exists(), "munged")
        self.daemons["slurmctld"] = bed.popen(
            HEAD,
            ["slurmctld", "-D", "-i", "-f", CONF],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for k in range(len(bed.names)):
            self._start_slurmd(k)
        self._await(self._all_idle, "slurmd on every node registered (sinfo: idle)")

    def _start_slurmd(self, k: int | str) -> None:
        name = self.bed.name(k)
        self.daemons[f"slurmd@{name}"] = self.bed.popen(
            k,
            ["slurmd", "-D", "-N", name, "-f", CONF],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop_slurmd(self, k: int | str) -> None:
        """Kill node k's slurmd (a node whose daemon died; slurmctld still counts it until
        `SlurmdTimeout`, or until `set_state(k, "down")`)."""
        proc = self.daemons.pop(f"slurmd@{self.bed.name(k)}")
        proc.kill_tree()
        proc.wait(timeout=10)

    def start_slurmd(self, k: int | str) -> None:
        """Start node k's slurmd again and wait until every node is idle (`ReturnToService=2`
        puts a node that registers back in service)."""
        self._start_slurmd(k)
        self._await(self._all_idle, f"slurmd on {self.bed.name(k)} registered again (idle)")

    def set_state(self, k: int | str, state: str, reason: str = "lockstep bed") -> None:
        """`scontrol update NodeName=<node> State=<state>` (down, resume, drain, ...)."""
        argv = ["scontrol", "update", f"NodeName={self.bed.name(k)}", f"State={state}"]
        if state.lower() in ("down", "drain", "fail"):
            argv.append(f"Reason={reason}")
        self.bed.run(HEAD, argv, env=self.env, timeout=10, check=True)

    def node_states(self) -> dict[str, str]:
        """sinfo's state of every node (`idle`, `down*`, `alloc`, ...)."""
        out = self.bed.run(
            HEAD, ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, timeout=10
        ).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def stop(self) -> None:
        for proc in reversed(list(self.daemons.values())):
            proc.kill_tree()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.daemons.clear()

    def _await(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.daemons.items() if p.poll() is not None]
            if dead:
                raise BedError(f"slurm: {', '.join(dead)} exited at start; {self._logs()}")
            if ready():
                return
            time.sleep(0.05)
        raise BedError(f"slurm: not ready within {self.ready_timeout:g}s: {what}; {self._logs()}")

    def _all_idle(self) -> bool:
        states = self.node_states()
        return all(states.get(n) == "idle" for n in self.bed.names)

    def _logs(self) -> str:
        tails = []
        for name in ("slurmctld", *(f"slurmd-{n}" for n in self.bed.names)):
            path = self.bed.state_path("slurm", "log", f"{name}.log")
            with contextlib.suppress(OSError):
                lines = [ln for ln in path.read_text().splitlines() if "error" in ln.lower()]
                if lines:
                    tails.append(f"{name}: {lines[-1]}")
        return "; ".join(tails) or "no errors logged"

    def _write_files(self) -> None:
        bed = self.bed
        for sub in ("slurm/log", "slurm/state", "munge"):
            bed.state_path(sub).mkdir(parents=True, exist_ok=True)
        munge = bed.state_path("munge")
        os.chmod(munge, 0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        prolog = bed.state_path("bin", "slurm-task-prolog")
        prolog.write_text(
            "#!/bin/sh\n"
            "# Slurm TaskProlog on the bed: a node's own variables (Cluster.set_node_env).\n"
            f'f={STATE}/nodes/$(hostname)/taskenv\n[ -r "$f" ] && sed "s/^/export /" "$f"\n'
            "exit 0\n"
        )
        os.chmod(prolog, 0o755)
        n = len(bed.names)
        names = f"{bed.names[0][:-1]}[0-{n - 1}]" if n > 1 else bed.names[0]
        conf = f"""\
# Written by lockstep_testbed.slurm for one test bed; lives and dies with it.
ClusterName=lockstep
SlurmctldHost={bed.head}({bed.address(HEAD)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={MUNGE_SOCKET}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={STATE}/bin/slurm-task-prolog
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/builtin
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation={STATE}/slurm/state
SlurmdSpoolDir=/run/slurmd
SlurmctldPidFile={STATE}/slurm/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile={STATE}/slurm/log/slurmctld.log
SlurmdLogFile={STATE}/slurm/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=2
NodeName={names} CPUs={self.cpus} State=UNKNOWN
PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        bed.state_path("slurm", "slurm.conf").write_text(conf)

    # ------------------------------------------------------------------ running jobs

    def srun_command(
        self, argv: Sequence[str], *, nodes: int | None = None, ntasks_per_node: int = 1
    ) -> list[str]:
        n = len(self.bed.names) if nodes is None else nodes
        return ["srun", f"-N{n}", f"--ntasks-per-node={ntasks_per_node}", *map(str, argv)]

    def srun(
        self,
        argv: Sequence[str],
        *,
        nodes: int | None = None,
        ntasks_per_node: int = 1,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess:
        """`srun -N<nodes> --ntasks-per-node=<n> [extra] argv` from the head; the tasks get
        srun's environment (the head's, plus `env`), as Slurm's default --export=ALL does."""
        cmd = self.srun_command(argv, nodes=nodes, ntasks_per_node=ntasks_per_node)
        cmd[1:1] = list(extra)
        try:
            return self.bed.run(HEAD, cmd, env={**self.env, **(env or {})}, timeout=timeout)
        except NodeTimeout as err:
            raise NodeTimeout(f"slurm: {err}; squeue: {self._squeue()}") from None

    def _squeue(self) -> str:
        with contextlib.suppress(BedError):
            out = self.bed.run(HEAD, ["squeue", "-h"], env=self.env, timeout=5).stdout
            return tail(out)
        return "(no answer)"
