"""`lockstep preflight --nnodes N --node-rank K --nproc-per-node n --rdzv-endpoint HOST:PORT`:
preflight's own multi-node launch, with torchrun's flags, through torchrun's launcher API.

torchrun's agents meet in a c10d rendezvous before any rank runs, so a node that cannot take
part there (its own hostname does not resolve, the endpoint does not, an interface named by
GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME is missing) ends its agent with a traceback while the
others wait out the join timeout (600 s) in silence. Here every node first *checks in*:

1. node 0 serves a small TCPStore at the endpoint's port + 1 (HOST:PORT+1); the other nodes
   poll it for up to `--timeout` seconds (by address when HOST is one, so a node whose own
   hostname does not resolve still gets there);
2. each node posts {host, nproc, problems} under its node rank: the checks that need no peers;
3. node 0 waits up to `--timeout` for all N, decides (`nodeverdict.decide`, pure) and posts the
   verdict; every node prints the same line and exits 1 (a node reported a problem) or 3 (a
   node never arrived), or goes on to the real launch: torchrun's c10d rendezvous at
   HOST:PORT, then `lockstep preflight` on every rank as under torchrun.

A node that cannot reach node 0 says so itself and exits 3; node 0 names it as never arrived.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import timedelta

from lockstep.env import localchecks, nodeverdict
from lockstep.errors import EXIT_OK, RankTimeout, UsageError

_POLL_S = 0.05
_LINGER_S = 10.0


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise UsageError(f"--rdzv-endpoint {text!r} is not HOST:PORT (a port below 65535)")
    return host.strip("[]"), int(port)


def node_problems(host: str) -> list[str]:
    """What this node can find wrong alone: its hostname, the endpoint's, its interfaces."""
    problems = []
    me = socket.gethostname()
    if localchecks.resolves("hostname", "own hostname", me)["status"] == "fail":
        problems.append(f"its hostname {me} does not resolve (fix /etc/hosts or DNS there)")
    if localchecks.resolves("endpoint", "endpoint", host)["status"] == "fail":
        problems.append(f"the endpoint host {host} does not resolve there")
    for check in localchecks.socket_ifnames():
        if check["status"] == "fail":
            problems.append(check["detail"])
    return problems


def check_in(args) -> tuple[dict, str]:
    """This node's part of the check-in; the verdict (`nodeverdict.decide`'s dict) and the
    run id every node's agent then uses."""
    import torch.distributed as dist

    host, port = parse_endpoint(args.rdzv_endpoint)
    where = f"{host}:{port + 1}"
    me = socket.gethostname()
    mine = {
        "node": args.node_rank,
        "host": me,
        "nproc": args.nproc_per_node,
        "problems": node_problems(host),
    }
    timeout = timedelta(seconds=args.timeout + 15)
    if args.node_rank == 0:
        try:
            store = dist.TCPStore(
                "0.0.0.0", port + 1, is_master=True, timeout=timeout, wait_for_workers=False
            )
        except RuntimeError as err:
            raise UsageError(
                f"node 0 ({me}) cannot serve the check-in on port {port + 1}: {_first_line(err)}"
            ) from None
    else:
        if not reachable(host, port + 1, args.timeout):
            raise RankTimeout(
                f"preflight: {me} (node {args.node_rank}) could not reach node 0's check-in at "
                f"{where} within {args.timeout:g}s ({'; '.join(mine['problems']) or 'node 0 not started, wrong endpoint, or a firewall'})"
            )
        try:
            store = dist.TCPStore(host, port + 1, is_master=False, timeout=timeout)
        except RuntimeError as err:
            raise RankTimeout(
                f"the check-in at {where} stopped answering: {_first_line(err)}"
            ) from None
    prefix = "lockstep/nodes"
    if store.add(f"{prefix}/claim/{args.node_rank}", 1) > 1:
        store.set(f"{prefix}/dup/{args.node_rank}/{uuid.uuid4().hex[:6]}", me)
    else:
        store.set(f"{prefix}/node/{args.node_rank}", json.dumps(mine))
    store.add(f"{prefix}/count", 1)
    if args.node_rank == 0:
        return _decide(store, prefix, args, f"{host}:{port + 1}")
    try:
        store.wait([f"{prefix}/verdict"], timeout)
    except RuntimeError:
        raise RankTimeout(
            f"preflight: node 0 gave no check-in verdict within {timeout.total_seconds():g}s "
            f"({where}); it stalled or died"
        ) from None
    answer = json.loads(store.get(f"{prefix}/verdict"))
    store.add(f"{prefix}/read", 1)
    return answer["verdict"], answer["run_id"]


def _decide(store, prefix: str, args, where: str) -> tuple[dict, str]:
    deadline = time.monotonic() + args.timeout
    while store.add(f"{prefix}/count", 0) < args.nnodes and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    checkins = {
        k: json.loads(store.get(f"{prefix}/node/{k}"))
        for k in range(args.nnodes)
        if store.check([f"{prefix}/node/{k}"])
    }
    duplicates = {}
    for k in range(args.nnodes):
        if store.add(f"{prefix}/claim/{k}", 0) > 1:
            duplicates[k] = ["another node"]
    verdict = nodeverdict.decide(
        args.nnodes,
        checkins,
        nproc=args.nproc_per_node,
        timeout_s=args.timeout,
        endpoint=where,
        duplicates=duplicates,
    )
    run_id = f"lockstep-preflight-{uuid.uuid4().hex[:8]}"
    store.set(f"{prefix}/verdict", json.dumps({"verdict": verdict, "run_id": run_id}))
    readers = len(checkins) - 1
    linger = time.monotonic() + _LINGER_S
    while store.add(f"{prefix}/read", 0) < readers and time.monotonic() < linger:
        time.sleep(_POLL_S)
    return verdict, run_id


def run_node(args) -> int:
    """Check in, then (all nodes ready) torchrun's launch of `lockstep preflight` on this node's
    ranks; the exit code every node agrees on."""
    from lockstep.env.cli import _rank_argv

    verdict, run_id = check_in(args)
    if not verdict["ok"]:
        print(verdict["line"], flush=True)
        return verdict["exit_code"]
    from lockstep.launch.ranks import run_multinode_cli

    code = run_multinode_cli(
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        endpoint=args.rdzv_endpoint,
        run_id=run_id,
        node_rank=args.node_rank,
        join_timeout=args.timeout,
        argv=["preflight", *_rank_argv(args)],
    )
    return code if code is not None else EXIT_OK


def reachable(host: str, port: int, within_s: float) -> bool:
    """Poll a store's port ourselves (preflight's store, the check-in's): TCPStore's own retries
    overrun the timeout and log C++ stack traces; this keeps the deadline exact and the message
    one line."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, within_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S * 2)


def _first_line(err: BaseException) -> str:
    from lockstep.redact import scrub_text

    return scrub_text((str(err).strip().splitlines() or [repr(err)])[0])


def from_kubeflow(environ=None) -> dict[str, str]:
    """Kubeflow's torchrun variables (PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
    PET_MASTER_ADDR, PET_MASTER_PORT; see launcher.KUBEFLOW_VARIABLES) as defaults for the
    multi-node flags, when the pod started `lockstep preflight` itself."""
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
