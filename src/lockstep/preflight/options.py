"""What one call of `lockstep preflight` was asked to do, decided once: the CLI builds an
`Options` from its flags (`Options.from_flags`), and everything below it reads that, never
argparse's Namespace.

A Kubeflow Trainer pod that starts `lockstep preflight` without torchrun gets torchrun's
variables (PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT)
as the defaults of the multi-node flags (`from_kubeflow`). The ranks preflight starts itself
(`--nproc N`, a node of `--nnodes N`) run `lockstep preflight` again with `rank_argv()`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from lockstep import extras
from lockstep.errors import UsageError
from lockstep.inputs import existing, writable
from lockstep.launch import detect

DEFAULT_TIMEOUT_S = 60.0


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


@dataclass(frozen=True)
class Options:
    """`lockstep preflight`'s flags, checked; `multinode` is None unless this call is one node
    of preflight's own multi-node launch."""

    timeout: float = DEFAULT_TIMEOUT_S
    lock: str | None = None
    json: str | None = None
    min_busbw: float | None = None
    links: bool | None = None  # None: on when the ranks span more than one host
    min_link_gbps: float | None = None
    exclude_out: str | None = None
    plot: str | None = None
    allow: tuple[str, ...] = ()
    nproc: int | None = None  # --nproc as given (None: not given; 1 rank by default)
    require_key: bool = False  # a missing job key (LOCKSTEP_JOB_KEY[_FILE]) is an error
    multinode: MultiNode | None = None

    @classmethod
    def from_flags(
        cls,
        *,
        nnodes: int | None = None,
        node_rank: int | None = None,
        nproc_per_node: int | None = None,
        rdzv_endpoint: str | None = None,
        environ: Mapping[str, str] | None = None,
        **flags,
    ) -> Options:
        """The options of these flags: the files they name checked (a missing lock, a folder
        that is not there: exit 2 before any rank starts), the multi-node flags resolved."""
        options = cls(**{**flags, "allow": tuple(flags.get("allow") or ())})
        existing(options.lock, "lock file")
        writable(options.json, "--json")
        writable(options.exclude_out, "--exclude-out")
        if options.plot is not None:  # before any rank starts, not after the verdict
            extras.require("lockstep preflight --plot", {"matplotlib": "the link heatmap"})
        multinode = _multinode(
            {
                "nnodes": nnodes,
                "node_rank": node_rank,
                "nproc_per_node": nproc_per_node,
                "rdzv_endpoint": rdzv_endpoint,
            },
            nproc=options.nproc,
            environ=os.environ if environ is None else environ,
        )
        return dataclasses.replace(options, multinode=multinode)

    def rank_argv(self) -> list[str]:
        """The options each rank preflight starts itself gets (all but --nproc and the
        multi-node flags)."""
        argv = ["--timeout", str(self.timeout)]
        for flag, value in (
            ("--lock", self.lock),
            ("--json", self.json),
            ("--min-busbw", self.min_busbw),
            ("--min-link-gbps", self.min_link_gbps),
            ("--exclude-out", self.exclude_out),
            ("--plot", self.plot),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if self.links is not None:
            argv.append("--links" if self.links else "--no-links")
        if self.require_key:
            argv.append("--require-key")
        for field in self.allow:
            argv += ["--allow", field]
        return argv


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
