"""Where a rank meets the others: lockstep's store at MASTER_ADDR:MASTER_PORT (rank 0's, or
torchrun's agent's), under this run's prefix and nonce, and the process group's own store
(`pg_store`: rank 0 serves it, the check-in's answer says where)."""

from __future__ import annotations

import os
import socket

from lockstep.errors import RankTimeout
from lockstep.launch.detect import RankInfo
from lockstep.preflight import pg_store
from lockstep.preflight.identity import address
from lockstep.preflight.store import Signer, Store, connect


def connect_protocol(info: RankInfo, timeout_s: float, signer: Signer) -> Store:
    """The c10d TCPStore: rank 0 serves it unless torchrun's agent already does; this job's
    prefix of it, signed under the run's nonce (rank 0 makes it)."""
    serve = info.rank == 0 and not info.agent_store
    where = f"{info.master_addr}:{info.master_port}"
    store = connect(
        info.master_addr,
        info.master_port,
        serve=serve,
        timeout_s=timeout_s,
        reach_s=timeout_s,
        multi_tenant=serve,
        messages={
            "unreachable": f"rank 0 missing: nothing answered at MASTER_ADDR:MASTER_PORT={where} "
            f"within {timeout_s:g}s (rank 0 not started, wrong address, or a firewall)",
            "cannot_serve": f"rank 0 cannot serve the store on {where}",
            "name": "the store",
        },
    )
    store = store.prefixed(f"lockstep/preflight/{run_id()}")
    store = store.signed(signer, f"rank {info.rank} on {socket.gethostname()}")
    run = store.begin_run(make=info.rank == 0, within_s=timeout_s)
    if run is None:
        raise RankTimeout(f"rank 0 posted no run nonce within {timeout_s:g}s; it stalled or died")
    return run


def serve_group(info: RankInfo, timeout_s: float) -> tuple[object, dict]:
    """Rank 0: the process group's own store (`pg_store`) and where the others find it: at
    MASTER_ADDR, where rank 0 serves lockstep's store; under torchrun's agent store (maybe
    on another host) at rank 0's own address toward it."""
    host = (address(info) if info.agent_store else None) or info.master_addr
    server, port = pg_store.serve(host, timeout_s)
    return server, {"host": host, "port": port}


def group_store(server, where: dict, timeout_s: float):
    """The process group's store: rank 0's own server, the others' client of it."""
    raw = server
    if raw is None:
        raw = pg_store.join(where["host"], where["port"], timeout_s)
    return pg_store.for_group(raw)


def run_id() -> str:
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"


def node_role(info: RankInfo, signer: Signer):
    """This rank's part on its node (`node_channel`): the leader (local rank 0, and rank 0
    always), a rank behind it, or None where the launcher gives no local rank and local
    world size (then every rank stands alone, as before issue 38)."""
    from lockstep.preflight import node_channel

    local, size = info.local_rank, info.local_world_size
    if local is None or not size or size < 2 or (info.rank == 0 and local != 0):
        return None
    host = socket.gethostname()
    node = str(info.node_rank) if info.node_rank is not None else host
    name = node_channel.name_of(
        os.getuid(), run_id(), f"{info.master_addr}:{info.master_port}", node
    )
    by = f"rank {info.rank} on {host}"
    if local == 0:
        return node_channel.Leader(name, signer, by, size - 1)
    return node_channel.Member(name, signer, by, f"its node's leader (local rank 0 on {host})")


class OnDemand:
    """A rank behind its leader needs lockstep's store only for what is not relayed (the
    link stage, a group's fingerprint, the failure diagnosis): connected on first use."""

    def __init__(self, make):
        self._make, self._store = make, None

    def __getattr__(self, name: str):
        if self._store is None:
            self._store = self._make()
        return getattr(self._store, name)
