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
3. node 0 waits up to `--timeout` for all N, decides (`node_verdict.decide`, pure) and posts the
   verdict; every node prints the same line and exits 1 (a node reported a problem) or 3 (a
   node never arrived), or goes on to the real launch: torchrun's c10d rendezvous at
   HOST:PORT, then `lockstep preflight` on every rank as under torchrun.

A node that cannot reach node 0 says so itself and exits 3; node 0 names it as never arrived.
Every value is signed with the job's key (`store`): a check-in or verdict that another host
wrote is refused and named, never believed.
"""

from __future__ import annotations

import socket
import time
import uuid

from lockstep.errors import EXIT_OK, RankTimeout
from lockstep.preflight import job_key, node_verdict
from lockstep.preflight.local.ifnames import socket_ifnames
from lockstep.preflight.local.resolves import resolves
from lockstep.preflight.options import MultiNode, Options
from lockstep.preflight.store import CheckIn, Signer, connect

LINGER_S = 10.0
_EXTRA_S = 15.0  # the store's own timeout beyond --timeout: node 0 decides at --timeout


def node_problems(host: str) -> list[str]:
    """What this node can find wrong alone: its hostname, the endpoint's, its interfaces."""
    problems = []
    me = socket.gethostname()
    if resolves("hostname", "own hostname", me)["status"] == "fail":
        problems.append(f"its hostname {me} does not resolve (fix /etc/hosts or DNS there)")
    if resolves("endpoint", "endpoint", host)["status"] == "fail":
        problems.append(f"the endpoint host {host} does not resolve there")
    for check in socket_ifnames():
        if check["status"] == "fail":
            problems.append(check["detail"])
    return problems


def check_in(multi: MultiNode, timeout_s: float, signer: Signer) -> tuple[dict, str]:
    """This node's part of the check-in; the verdict (`node_verdict.decide`'s dict) and the
    run id every node's agent then uses."""
    host, port = multi.endpoint
    where = f"{host}:{port + 1}"
    me = socket.gethostname()
    mine = {
        "node": multi.node_rank,
        "host": me,
        "nproc": multi.nproc_per_node,
        "problems": node_problems(host),
    }
    why = "; ".join(mine["problems"]) or "node 0 not started, wrong endpoint, or a firewall"
    store = connect(
        host,
        port + 1,
        serve=multi.node_rank == 0,
        timeout_s=timeout_s + _EXTRA_S,
        reach_s=timeout_s,
        messages={
            "cannot_serve": f"node 0 ({me}) cannot serve the check-in on port {port + 1}, the "
            "endpoint's port + 1 (give an endpoint port whose next one is free, below the "
            "ephemeral range of net.ipv4.ip_local_port_range, where connections take theirs)",
            "unreachable": f"preflight: {me} (node {multi.node_rank}) could not reach node 0's "
            f"check-in at {where} within {timeout_s:g}s ({why})",
            "name": "the check-in",
        },
    )
    store = store.signed(signer, f"node {multi.node_rank} on {me}").prefixed("lockstep/nodes")
    run = store.begin_run(make=multi.node_rank == 0, within_s=timeout_s + _EXTRA_S)
    if run is None:
        raise RankTimeout(f"preflight: node 0 posted no run nonce at {where}; it stalled or died")
    checkin = CheckIn(run, "checkin")
    checkin.post(multi.node_rank, mine, who=me)
    if multi.node_rank == 0:
        return _decide(checkin, multi, timeout_s, where)
    answer = checkin.await_answer(timeout_s + _EXTRA_S, _is_answer)
    if answer is None:
        raise RankTimeout(
            f"preflight: node 0 gave no check-in verdict within {timeout_s + _EXTRA_S:g}s "
            f"({where}); it stalled or died"
        )
    return answer["verdict"], answer["run_id"]


def _decide(checkin: CheckIn, multi: MultiNode, timeout_s: float, where: str) -> tuple[dict, str]:
    checkins = checkin.gather(multi.nnodes, time.monotonic() + timeout_s, _is_checkin)
    verdict = node_verdict.decide(
        multi.nnodes,
        checkins,
        nproc=multi.nproc_per_node,
        timeout_s=timeout_s,
        endpoint=where,
        duplicates={k: ["another node"] for k in checkin.claimed_twice(multi.nnodes)},
        refused={k: (err.by, err.detail) for k, err in checkin.refused.items()},
    )
    run_id = f"lockstep-preflight-{uuid.uuid4().hex[:8]}"
    checkin.answer({"verdict": verdict, "run_id": run_id})
    checkin.linger(len(checkins) - 1, LINGER_S)
    return verdict, run_id


def run_node(options: Options) -> int:
    """Check in, then (all nodes ready) torchrun's launch of `lockstep preflight` on this node's
    ranks; the exit code every node agrees on."""
    multi = options.multinode
    assert multi is not None
    signer = Signer(job_key.load())
    job_key.require(signer.key, options.require_key)
    verdict, run_id = check_in(multi, options.timeout, signer)
    if not verdict["ok"]:
        print(verdict["line"], flush=True)
        return verdict["exit_code"]
    if not signer.authenticated:
        print(f"preflight: UNAUTHENTICATED check-in (no {job_key.KEY_ENV}): {verdict['line']}")
    from lockstep.launch.ranks import run_multinode_cli

    code = run_multinode_cli(
        nnodes=multi.nnodes,
        nproc_per_node=multi.nproc_per_node,
        endpoint=multi.rdzv_endpoint,
        run_id=run_id,
        node_rank=multi.node_rank,
        join_timeout=options.timeout,
        argv=["preflight", *options.rank_argv()],
    )
    return code if code is not None else EXIT_OK


def _is_checkin(value: object) -> bool:
    """A node's check-in as `node_verdict` reads it (anything else is refused as malformed)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("nproc"), int)
        and isinstance(value.get("problems"), list)
        and all(isinstance(p, str) for p in value["problems"])
    )


def _is_answer(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("run_id"), str)
        and isinstance(value.get("verdict"), dict)
        and isinstance(value["verdict"].get("ok"), bool)
        and isinstance(value["verdict"].get("exit_code"), int)
        and isinstance(value["verdict"].get("line"), str)
    )
