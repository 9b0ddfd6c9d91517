"""`lockstep preflight`'s ranks started by hand, as a launcher would: RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in each one's environment, every other launcher variable
removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(COLUMNS="400", PYTHONUNBUFFERED="1", **extra)
    return env


def by_hand(
    world: int,
    ranks,
    cwd: Path,
    args=(),
    per_rank_env=None,
    per_rank_args=None,
    program=None,
    per_rank_program=None,
):
    """Start `python -m lockstep preflight` for `ranks` with RANK/WORLD_SIZE/MASTER_*;
    `program`: the argv that stands for `python -m lockstep` (a script calling its `main`);
    `per_rank_program`: rank -> such an argv for that rank alone."""
    port, procs = free_port(), {}
    for rank in ranks:
        env = base_env(
            RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        env.update((per_rank_env or {}).get(rank, {}))
        mine = (per_rank_program or {}).get(rank) or program
        cmd = [*(mine or [sys.executable, "-m", "lockstep"]), "preflight", *args]
        cmd += (per_rank_args or {}).get(rank, [])
        procs[rank] = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
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
