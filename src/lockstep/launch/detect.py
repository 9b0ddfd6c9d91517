"""Which launcher started this process, and this rank's place in the job (`RankInfo`): the one
reader of launcher variables, for `preflight`, `train` and `check` alike. Half-set or
contradictory variables are a `UsageError` naming them: a rank that guesses its place hangs the
others. Design: docs/design/launch.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import astuple, dataclass

from lockstep.registry import Registry


@dataclass(frozen=True)
class RankInfo:
    launcher: str
    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    master_addr: str
    master_port: int
    # torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT; ranks only connect.
    agent_store: bool = False


@dataclass(frozen=True)
class Scheme:
    """One launcher's variables: the one that marks it, and those of this rank's place (None:
    it has none)."""

    name: str
    marker: str
    rank: str
    world_size: str
    local_rank: str | None
    local_world_size: str | None
    node_rank: str | None


# The first launcher whose marker is set wins (torchrun inside a Slurm allocation is
# torchelastic, mpirun inside one is openmpi).
SCHEMES: Registry[Scheme] = Registry("launcher", [
    Scheme("torchelastic", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
           "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    Scheme("deepspeed", "CROSS_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE",
           "CROSS_RANK"),
    Scheme("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
           "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
           None),  # not OMPI_COMM_WORLD_NODE_RANK: the rank on the node, not the node's
    Scheme("mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
           "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", None),
    Scheme("slurm", "SLURM_PROCID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None,
           "SLURM_NODEID"),
    Scheme("pmi", "PMI_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    Scheme("pmix", "PMIX_RANK", "PMIX_RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", None),
    Scheme("manual", "RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", None),
])  # fmt: skip

_GENERIC = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")

# Variables a launcher sets that belong in the fingerprint's env section.
LAUNCHER_VARIABLES = sorted(
    {name for scheme in SCHEMES.values() for name in astuple(scheme)[1:] if name}
    | {
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "CROSS_SIZE",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_NNODES",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_TASKS_PER_NODE",
        "SLURM_STEP_TASKS_PER_NODE",
        "OMPI_COMM_WORLD_NODE_RANK",
    }
)

# Launcher variables that differ between ranks by design.
PER_RANK_VARIABLES = sorted(
    {name for s in SCHEMES.values() for name in (s.rank, s.local_rank, s.node_rank) if name}
    | {"ROLE_RANK", "TORCHELASTIC_ERROR_FILE", "OMPI_COMM_WORLD_NODE_RANK"}
)


def detect(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The launcher's view of this rank, or None when no launcher variable is set."""
    env = os.environ if environ is None else environ
    found = next((s for s in SCHEMES.values() if s.marker in env), None)
    if found is None:
        partial = [name for name in _GENERIC if name in env]
        if partial:
            _half_set("manual", partial, ["RANK", "WORLD_SIZE"], env)
        return None
    launcher, marker, rank_var, size_var, local_var, local_size_var, node_var = astuple(found)
    _half_set(launcher, [marker], [rank_var, size_var], env)
    rank = _int(env, rank_var)
    world_size = _int(env, size_var)
    local_rank = _int(env, local_var) if local_var and local_var in env else None
    local_world_size = _local_world_size(launcher, local_size_var, env)
    node_rank = _int(env, node_var) if node_var and node_var in env else None
    if launcher in ("torchelastic", "deepspeed"):
        _half_set(launcher, [rank_var], ["LOCAL_RANK", local_size_var], env)
    if not 0 <= rank < world_size:
        raise _usage(f"{rank_var}={rank} is outside WORLD_SIZE {size_var}={world_size}")
    if local_rank is not None and local_world_size is not None and local_rank >= local_world_size:
        raise _usage(
            f"{local_var}={local_rank} is not below the local world size "
            f"{local_world_size} ({local_size_var or 'SLURM_TASKS_PER_NODE'})"
        )
    _check_generic_agrees(launcher, rank_var, rank, size_var, world_size, env)
    if launcher == "slurm":
        _check_slurm_layout(world_size, env)
    if launcher == "manual":
        _check_kubeflow(rank, world_size, env)
    master_addr, master_port = _rendezvous(launcher, env)
    return RankInfo(
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def adopt(environ: MutableMapping[str, str] | None = None) -> RankInfo | None:
    """`detect()`, then its answer written as torch.distributed's `env://` variables, so that
    ranks of srun, mpirun or PMI join a process group as torchrun's do."""
    env = os.environ if environ is None else environ
    info = detect(env)
    if info is not None:
        values = {
            "RANK": info.rank,
            "WORLD_SIZE": info.world_size,
            "LOCAL_RANK": info.local_rank,
            "LOCAL_WORLD_SIZE": info.local_world_size,
            "MASTER_ADDR": info.master_addr,
            "MASTER_PORT": info.master_port,
        }
        env.update({name: str(value) for name, value in values.items() if value is not None})
    return info


def _usage(message: str):
    from lockstep.errors import UsageError

    return UsageError(message)


def _half_set(launcher: str, present: list[str], needed: list[str], env: Mapping[str, str]):
    missing = [name for name in needed if name and name not in env]
    if missing:
        raise _usage(
            f"{launcher} launch is half-set: {', '.join(present)} set but {', '.join(missing)} "
            "missing; set them all or none"
        )


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        value = int(env[name])
    except ValueError:
        raise _usage(f"{name}={env[name]!r} is not an integer") from None
    if value < 0:
        raise _usage(f"{name}={value} is negative")
    return value


def _local_world_size(launcher: str, name: str | None, env: Mapping[str, str]) -> int | None:
    if name and name in env:
        return _int(env, name)
    if launcher == "slurm":
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if per_node:
            counts = expand_tasks_per_node(per_node)
            node = int(env.get("SLURM_NODEID", "0"))
            return counts[node] if node < len(counts) else None
    return None


def _check_generic_agrees(
    launcher: str, rank_var: str, rank: int, size_var: str, world_size: int, env
) -> None:
    """RANK/WORLD_SIZE exported by hand beside mpirun or srun must say the same."""
    for generic, own, value in (("RANK", rank_var, rank), ("WORLD_SIZE", size_var, world_size)):
        if generic != own and generic in env and env[generic] != str(value):
            raise _usage(
                f"contradictory {launcher} variables: {own}={value} but {generic}={env[generic]}; "
                f"unset {generic} or make it agree"
            )


def _check_slurm_layout(world_size: int, env: Mapping[str, str]) -> None:
    """SLURM_NTASKS must be the sum of the step's tasks per node, one count per listed host: a
    stale or hand-exported variable puts ranks on nodes that are not there."""
    nodelist_var = next(
        (v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if v in env), None
    )
    per_node_var = next(
        (v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if v in env), None
    )
    if nodelist_var is None:
        return
    from lockstep.launch.hostlist import HostlistError, expand

    try:
        hosts = expand(env[nodelist_var])
    except HostlistError as err:
        raise _usage(str(err)) from None
    if per_node_var is None:
        return
    counts = expand_tasks_per_node(env[per_node_var])
    if len(counts) != len(hosts):
        raise _usage(
            f"{per_node_var}={env[per_node_var]} gives {len(counts)} node(s) but "
            f"{nodelist_var}={env[nodelist_var]} lists {len(hosts)}"
        )
    if sum(counts) != world_size:
        raise _usage(
            f"SLURM_NTASKS={world_size} disagrees with the host list: {nodelist_var}="
            f"{env[nodelist_var]} with {per_node_var}={env[per_node_var]} is {sum(counts)} tasks"
        )


# torchrun's arguments as Kubeflow's pods get them (docs/design/launch.md, "Kubeflow").
KUBEFLOW_VARIABLES = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)


def _check_kubeflow(rank: int, world_size: int, env: Mapping[str, str]) -> None:
    """A PyTorchJob pod started without torchrun: RANK counts pods, WORLD_SIZE processes; a
    process taking them as its own waits forever."""
    nproc = env.get("PET_NPROC_PER_NODE", "")
    nnodes = env.get("PET_NNODES", "")
    if not nproc.isdigit() or int(nproc) <= 1:
        return
    if nnodes.isdigit() and world_size != int(nnodes) * int(nproc):
        return
    raise _usage(
        f"Kubeflow PyTorchJob variables without torchrun: RANK={rank} is the pod's index "
        f"(PET_NODE_RANK={env.get('PET_NODE_RANK', '?')}) but WORLD_SIZE={world_size} counts "
        f"processes (PET_NNODES={nnodes or '?'} x PET_NPROC_PER_NODE={nproc}); start the "
        "command with torchrun, or run lockstep preflight --nnodes $PET_NNODES --node-rank "
        "$PET_NODE_RANK --nproc-per-node $PET_NPROC_PER_NODE --rdzv-endpoint "
        "$PET_MASTER_ADDR:$PET_MASTER_PORT"
    )


def _rendezvous(launcher: str, env: Mapping[str, str]) -> tuple[str, int]:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if launcher == "slurm":
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if addr is None and nodelist:
            addr = first_host(nodelist)
        if port is None and "SLURM_JOB_ID" in env:
            port = str(15000 + int(env["SLURM_JOB_ID"]) % 20000)
    missing = [n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None]
    if missing:
        hint = {
            "openmpi": "e.g. mpirun -x MASTER_ADDR=<first host> -x MASTER_PORT=29500",
            "slurm": "srun sets neither; export them or SLURM_STEP_NODELIST and SLURM_JOB_ID",
        }.get(launcher, "export the address and a free port of rank 0's host on every rank")
        raise _usage(f"{launcher} launch needs {' and '.join(missing)} ({hint})")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _usage(f"MASTER_PORT={port!r} is not a port number (1-65535)")
    return addr, int(port)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: `gpu[03-05,09],cpu1` -> `gpu03`."""
    from lockstep.launch.hostlist import HostlistError, expand

    try:
        return expand(nodelist)[0]
    except HostlistError as err:
        raise _usage(f"{err}; export MASTER_ADDR") from None


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise _usage(f"cannot read SLURM_TASKS_PER_NODE={spec!r}")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts
