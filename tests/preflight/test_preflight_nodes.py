"""The multi-node check-in's verdict, pure: it names the nodes that cannot start (the I/O runs
on the cluster bed: tests/cluster)."""

from __future__ import annotations

from lockstep.preflight import node_verdict


def checkin(node, host, *problems, nproc=2):
    return {"node": node, "host": host, "nproc": nproc, "problems": list(problems)}


def test_all_nodes_ready():
    got = node_verdict.decide(
        4, {k: checkin(k, f"ls{k}") for k in range(4)}, nproc=2, timeout_s=20, endpoint="ls0:1"
    )
    assert (
        got["ok"] and got["exit_code"] == 0 and got["line"] == "check-in: 4 nodes ready (8 ranks)"
    )


def test_a_node_that_cannot_resolve_itself_is_named_with_its_ranks():
    nodes = {k: checkin(k, f"ls{k}") for k in range(4)}
    nodes[2] = checkin(2, "ls2", "its hostname ls2 does not resolve (fix /etc/hosts or DNS there)")
    got = node_verdict.decide(4, nodes, nproc=2, timeout_s=20, endpoint="ls0:29401")
    assert got["exit_code"] == 1 and got["hosts"] == ["ls2"]
    assert "ls2 (node 2, ranks 4-5): its hostname ls2 does not resolve" in got["line"]


def test_missing_nodes_are_named_with_the_ranks_they_would_start():
    nodes = {k: checkin(k, f"ls{k}") for k in (0, 1)}
    got = node_verdict.decide(4, nodes, nproc=2, timeout_s=8, endpoint="ls0:29401")
    assert got["exit_code"] == 3 and got["missing"] == [2, 3]
    assert "nodes 2-3 (ranks 4-7) never checked in within 8s at ls0:29401" in got["line"]
    # a failure and a missing node: the failure decides the exit code, both are named
    nodes[1] = checkin(1, "ls1", "GLOO_SOCKET_IFNAME names eth0, absent here (have lo, ib0)")
    got = node_verdict.decide(4, nodes, nproc=2, timeout_s=8, endpoint="ls0:29401")
    assert got["exit_code"] == 1 and "ls1 (node 1, ranks 2-3): GLOO" in got["line"]
    assert "never checked in" in got["line"]


def test_a_node_rank_claimed_twice_is_named():
    nodes = {k: checkin(k, f"ls{k}") for k in range(2)}
    got = node_verdict.decide(
        2, nodes, nproc=1, timeout_s=8, endpoint="h:1", duplicates={1: ["another node"]}
    )
    assert got["exit_code"] == 1 and "node rank 1 claimed also by another node" in got["line"]
