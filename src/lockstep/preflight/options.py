"""What one call of `lockstep preflight` was asked to do, declared once (`Options`, whose
fields are its flags) and checked once (`Options.checked`). A Kubeflow Trainer pod's PET_*
variables are the multi-node flags' defaults where no torchrun started it (`from_kubeflow`);
the ranks preflight starts itself get `rank_argv()`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from lockstep import extras
from lockstep.env.cli import allow
from lockstep.errors import UsageError
from lockstep.flags import argv, flag
from lockstep.inputs import (
    existing,
    non_negative_int,
    positive_float,
    positive_int,
    seconds,
    writable,
)
from lockstep.launch import detect


@dataclass(frozen=True)
class MultiNode:
    """preflight's own multi-node launch: this node's part (`--nnodes` and its flags)."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_endpoint: str  # HOST:PORT, node 0's address and rendezvous port

    @property
    def endpoint(self) -> tuple[str, int]:
        return parse_endpoint(self.rdzv_endpoint)


MULTINODE = (
    "multi-node launch (torchrun's flags; every node first checks in with node 0 at the "
    "endpoint's port + 1, so a node that cannot start is named within --timeout)"
)


@dataclass(frozen=True)
class Options:
    """`lockstep preflight`'s flags, checked (`checked`); `multinode` is None unless this call
    is one node of preflight's own multi-node launch."""

    nproc: int | None = flag(
        "--nproc", type=positive_int, metavar="N", default=None, shown="1",
        help="no launcher: start N local ranks through torchrun's launcher API",
    )  # fmt: skip
    nnodes: int | None = flag(
        "--nnodes", type=positive_int, metavar="N", default=None, group=MULTINODE,
        help="nodes in the job (one call per node)",
    )  # fmt: skip
    node_rank: int | None = flag(
        "--node-rank", type=non_negative_int, metavar="K", default=None, group=MULTINODE,
        help="this node's index, 0..N-1",
    )  # fmt: skip
    nproc_per_node: int | None = flag(
        "--nproc-per-node", type=positive_int, metavar="n", default=None, shown="1",
        group=MULTINODE, help="ranks on each node",
    )  # fmt: skip
    rdzv_endpoint: str | None = flag(
        "--rdzv-endpoint", metavar="HOST:PORT", default=None, group=MULTINODE,
        help="node 0's address and rendezvous port",
    )  # fmt: skip
    timeout: float = flag(
        "--timeout", type=seconds, default=60.0, metavar="S", to_ranks=True,
        help="seconds to wait for peers at each step",
    )  # fmt: skip
    lock: str | None = flag(
        "--lock", metavar="PATH", default=None, to_ranks=True,
        help="lock file every rank must match exactly",
    )  # fmt: skip
    json: str | None = flag(
        "--json", metavar="PATH", default=None, to_ranks=True,
        help="write rank 0's full report here",
    )  # fmt: skip
    min_busbw: float | None = flag(
        "--min-busbw", type=float, metavar="GBPS", default=None, to_ranks=True,
        help="fail below this all_reduce busbw",
    )  # fmt: skip
    links: bool | None = flag(
        "--links", negatable=True, default=None, to_ranks=True,
        shown="on when the ranks span more than one host",
        help="measure point-to-point bandwidth between node pairs and name a slow node or link "
        "({default}; --links also between the ranks of one host). A link whose transfers were "
        "all CPU-starved is reported as not judged, never as slow",
    )  # fmt: skip
    min_link_gbps: float | None = flag(
        "--min-link-gbps", type=positive_float, metavar="GBPS", default=None, to_ranks=True,
        help="also fail a link below this many Gb/s (the verdict needs no fixed figure)",
    )  # fmt: skip
    exclude_out: str | None = flag(
        "--exclude-out", metavar="FILE", default=None, to_ranks=True,
        help="write the nodes to leave out as a Slurm host list (sbatch --exclude=$(cat FILE))",
    )  # fmt: skip
    drain_out: str | None = flag(
        "--drain-out", metavar="FILE", default=None, to_ranks=True,
        help="write one line per node to drain, HOSTNAME<TAB>lockstep: REASON, as `scontrol "
        "update NodeName=... State=DRAIN Reason=...` takes them (empty when none)",
    )  # fmt: skip
    plot: str | None = flag(
        "--plot", metavar="DIR", default=None, to_ranks=True,
        help="write DIR/links.png, the link heatmap",
    )  # fmt: skip
    require_key: bool = flag(
        "--require-key", default=False, to_ranks=True,
        help="exit 2 when no job key is set (LOCKSTEP_JOB_KEY or LOCKSTEP_JOB_KEY_FILE); without "
        "one, ranks on several hosts run unauthenticated and the verdict says UNAUTHENTICATED",
    )  # fmt: skip
    allow: tuple[str, ...] = allow(to_ranks=True)
    multinode: MultiNode | None = None

    def checked(self, environ: Mapping[str, str] | None = None) -> Options:
        """These options with the files they name checked (a missing lock, a folder that is not
        there: exit 2 before any rank starts) and the multi-node flags resolved."""
        existing(self.lock, "lock file")
        writable(self.json, "--json")
        writable(self.exclude_out, "--exclude-out")
        writable(self.drain_out, "--drain-out")
        if self.plot is not None:  # before any rank starts, not after the verdict
            extras.require("lockstep preflight --plot", {"matplotlib": "the link heatmap"})
        given = {name: getattr(self, name) for name in MultiNode.__dataclass_fields__}
        multinode = _multinode(
            given, nproc=self.nproc, environ=os.environ if environ is None else environ
        )
        return dataclasses.replace(self, multinode=multinode)

    def rank_argv(self) -> list[str]:
        """The options each rank preflight starts itself gets (all but --nproc and the
        multi-node flags)."""
        return argv(self)


def _multinode(given: dict, *, nproc: int | None, environ: Mapping[str, str]) -> MultiNode | None:
    """This node's part of preflight's own multi-node launch: --nnodes given, or a Kubeflow
    Trainer pod's PET_* variables without torchrun (then they are the flags' defaults); None
    when this call is no such launch."""
    flags = dict(given)
    if flags["nnodes"] is None:
        pet = from_kubeflow(environ)
        if not pet or "RANK" in environ or "TORCHELASTIC_RUN_ID" in environ:
            named = [_flag(f) for f, v in flags.items() if v is not None]
            if named:
                raise UsageError(
                    f"{', '.join(named)} belong to a multi-node launch: add --nnodes N"
                )
            return None
        for name, value in pet.items():
            if flags[name] is None:
                flags[name] = int(value) if name != "rdzv_endpoint" else value
    try:
        info = detect.detect(environ)
    except UsageError:
        info = None  # e.g. a PyTorchJob's RANK/WORLD_SIZE: the flags say what this launch is
    if info is not None and info.launcher != "manual":
        raise UsageError(
            f"--nnodes starts torchrun's agent itself; drop it when running under {info.launcher}"
        )
    if nproc is not None:
        raise UsageError("--nproc is for one node; with --nnodes give --nproc-per-node")
    missing = [_flag(f) for f in ("node_rank", "rdzv_endpoint") if flags[f] is None]
    if missing:
        raise UsageError(f"--nnodes {flags['nnodes']} needs {' and '.join(missing)}")
    if flags["node_rank"] >= flags["nnodes"]:
        raise UsageError(
            f"--node-rank {flags['node_rank']} is not below --nnodes {flags['nnodes']}"
        )
    parse_endpoint(flags["rdzv_endpoint"])
    if flags["nproc_per_node"] is None:
        flags["nproc_per_node"] = 1
    return MultiNode(**flags)


def from_kubeflow(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Kubeflow's torchrun variables (PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
    PET_MASTER_ADDR, PET_MASTER_PORT; see `lockstep.launch.detect.KUBEFLOW_VARIABLES`) as
    defaults for the multi-node flags, when the pod started `lockstep preflight` itself."""
    env = os.environ if environ is None else environ
    out = {}
    if env.get("PET_NNODES", "").isdigit():
        out["nnodes"] = env["PET_NNODES"]
    if env.get("PET_NODE_RANK", "").isdigit():
        out["node_rank"] = env["PET_NODE_RANK"]
    if env.get("PET_NPROC_PER_NODE", "").isdigit():
        out["nproc_per_node"] = env["PET_NPROC_PER_NODE"]
    if env.get("PET_MASTER_ADDR") and env.get("PET_MASTER_PORT"):
        out["rdzv_endpoint"] = f"{env['PET_MASTER_ADDR']}:{env['PET_MASTER_PORT']}"
    return out


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise UsageError(f"--rdzv-endpoint {text!r} is not HOST:PORT (a port below 65535)")
    return host.strip("[]"), int(port)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
