"""torchrun across the bed: one agent per node, c10d rendezvous on node 0's address."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep_testbed.errors import BedError
from lockstep_testbed.processes import NodeProcess, children, descendants

if TYPE_CHECKING:
    from lockstep_testbed.bed import Cluster


def torchrun_command(
    bed: Cluster,
    argv: Sequence[str],
    *,
    nnodes: int | str | None = None,
    nproc_per_node: int = 1,
    port: int = 29400,
    rdzv_id: str = "lockstep-bed",
    extra: Sequence[str] = (),
) -> list[str]:
    """One node's agent: `torchrun --nnodes N --nproc-per-node n --rdzv-backend c10d
    --rdzv-endpoint ls0:<port> [extra] argv` (argv starts with `-m module` or a script)."""
    torchrun = Path(bed.python).parent / "torchrun"
    head = [str(torchrun)] if torchrun.exists() else [bed.python, "-m", "torch.distributed.run"]
    nnodes = len(bed.names) if nnodes is None else nnodes
    return [
        *head,
        *("--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node)),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{bed.hostname(0)}:{port}"),
        *("--rdzv-id", rdzv_id),
        *extra,
        *map(str, argv),
    ]


def start_torchrun(
    bed: Cluster,
    argv: Sequence[str],
    *,
    nodes: Sequence[int] | None = None,
    nnodes: int | str | None = None,
    nproc_per_node: int = 1,
    port: int = 29400,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> dict[int, NodeProcess]:
    """Start the agents on `nodes` (default: all; leave a node out for one whose agent never
    starts); returns them by node index, stdout and stderr as pipes."""
    which = list(range(len(bed.names))) if nodes is None else list(nodes)
    nnodes = len(bed.names) if nnodes is None else nnodes
    cmd = torchrun_command(
        bed, argv, nnodes=nnodes, nproc_per_node=nproc_per_node, port=port, extra=extra
    )
    return {k: bed.popen(k, cmd, env=env, stderr=subprocess.PIPE) for k in which}


def torchrun(
    bed: Cluster,
    argv: Sequence[str],
    *,
    nodes: Sequence[int] | None = None,
    nnodes: int | str | None = None,
    nproc_per_node: int = 1,
    port: int = 29400,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    timeout: float = 120.0,
) -> dict[str, subprocess.CompletedProcess]:
    """Run torchrun's agents on the nodes and wait for all of them (`NodeTimeout` names the
    nodes whose agent was still running at `timeout`); results by node name."""
    procs = start_torchrun(
        bed,
        argv,
        nodes=nodes,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        port=port,
        env=env,
        extra=extra,
    )
    return bed.wait_all(procs, timeout)


def agent_pid(agent: NodeProcess) -> int | None:
    """Host pid of the torchrun agent that `start_torchrun` started on a node (the child of its
    `nsenter`, which execs setpriv, then torchrun), or None once it has exited."""
    kids = children(agent.pid)
    return kids[0] if kids else None


def worker_pids(agent: NodeProcess) -> list[int]:
    """Host pids of the agent's worker processes (its children: one per local rank)."""
    pid = agent_pid(agent)
    return children(pid) if pid is not None else []


def kill_workers(agent: NodeProcess, sig: int = signal.SIGKILL) -> list[int]:
    """Kill a node's worker processes and everything they started, not its agent (a rank that
    crashes, or the OOM killer): the agent sees them fail and, with restarts left, restarts
    every node's workers. Returns the workers' pids; BedError when the agent has none."""
    workers = worker_pids(agent)
    if not workers:
        raise BedError(f"{agent.node}: the torchrun agent has no worker process to kill")
    for pid in [p for w in workers for p in descendants(w)] + workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return workers
