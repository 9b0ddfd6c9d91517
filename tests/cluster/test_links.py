"""The link stage on the bed (issue 23): every node's veth shaped with tc tbf (RATE, a small
burst), so a clean link's bandwidth is set by tc, not by this machine's two busy cores, and the
measured messages (LINK_BYTES) are 64 times the burst. One rank per node, started directly with
the generic launcher variables (no torchrun agents: fewer Pythons on two cores).

- clean 4 and 8 nodes: no slow node or link named, exit 0;
- one node's veth at a fifth: that node named (not its partners), exit 1, the exclude list;
- one link at a fifth between two nodes only (htb + a u32 filter on the peer's address): that
  pair named, neither node called slow;
- a node that stops answering during the link stage: named within the timeout, exit 3.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from lockstep.cluster import Cluster, unavailable

pytestmark = pytest.mark.cluster

RATE, SLOW, BURST = "100mbit", "20mbit", "16kb"
LINK_BYTES = 1 << 20
WAIT = 240  # ranks importing torch on a small, busy runner


def need() -> None:
    """Skip where no bed can be built (an error under LOCKSTEP_REQUIRE_CLUSTER=1)."""
    import os
    import shutil

    reason = unavailable() or (None if shutil.which("tc") else "the link tests need tc")
    if reason and os.environ.get("LOCKSTEP_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"LOCKSTEP_REQUIRE_CLUSTER=1 but {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)


def shape(bed: Cluster) -> None:
    for k in range(len(bed.names)):
        bed.rate_limit(k, RATE, burst=BURST)


@pytest.fixture(scope="module")
def bed4():
    need()
    with Cluster(4, env={"NO_COLOR": "1"}) as bed:
        shape(bed)
        yield bed


def preflight(bed: Cluster, name: str, *, timeout: float = 60, env=None, port=29511, extra=()):
    """Run one rank per node; returns (results by node name, rank 0's report, wall seconds)."""
    n = len(bed.names)
    report = bed.shared / f"{name}.json"
    exclude = bed.shared / f"{name}.exclude"
    procs = {}
    for k in range(n):
        rank_env = {
            "RANK": str(k),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": bed.hostname(0),
            "MASTER_PORT": str(port),
            "LOCKSTEP_LINK_BYTES": str(LINK_BYTES),
            **((env or {}).get(k, {})),
        }
        argv = [bed.python, "-m", "lockstep", "preflight", "--links", "--timeout", str(timeout)]
        argv += extra
        if k == 0:
            argv += ["--json", str(report), "--exclude-out", str(exclude)]
        procs[k] = bed.popen(k, argv, env=rank_env, stderr=subprocess.PIPE)
    return procs, report, exclude


def finish(bed, procs, report, exclude):
    results = bed.wait_all(procs, WAIT)
    data = json.loads(report.read_text())
    return results, data, exclude.read_text().strip()


def test_clean_four_nodes_name_nothing(bed4):
    results, data, exclude = finish(bed4, *preflight(bed4, "clean4"))
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed4.names, 0), {
        n: r.stderr[-1500:] for n, r in results.items()
    }
    links = data["links"]
    assert data["finding"] is None and links["kind"] is None
    assert links["slow_nodes"] == [] and links["slow_links"] == [] and exclude == ""
    assert len(links["links"]) == 6 and links["schedule"] == "full"
    matrix = links["matrix_gbps"]
    assert all(matrix[i][j] for i in range(4) for j in range(4) if i != j)
    assert "links: 4 nodes" in results["ls0"].stdout  # the table in the terminal


def test_slow_node_named_not_its_partners(bed4):
    bed4.rate_limit(2, SLOW, burst=BURST)
    try:
        results, data, exclude = finish(bed4, *preflight(bed4, "slownode", port=29512))
    finally:
        bed4.rate_limit(2, RATE, burst=BURST)
    assert results["ls0"].returncode == 1, results["ls0"].stdout[-3000:]
    links = data["links"]
    assert [s["host"] for s in links["slow_nodes"]] == ["ls2"], links
    assert links["slow_links"] == []
    assert data["finding"] == "slow_node" and data["exit_code"] == 1
    assert exclude == "ls2"
    assert "slow node ls2" in results["ls0"].stdout


def test_slow_link_named_neither_node(bed4):
    bed4.rate_limit_pair(1, 2, SLOW, others=RATE)
    try:
        results, data, _ = finish(bed4, *preflight(bed4, "slowlink", port=29513))
    finally:
        for k in (1, 2):
            bed4.rate_limit(k, RATE, burst=BURST)
    assert results["ls0"].returncode == 1, results["ls0"].stdout[-3000:]
    links = data["links"]
    assert links["slow_nodes"] == [], links
    assert [sorted(s["hosts"]) for s in links["slow_links"]] == [["ls1", "ls2"]]
    assert data["finding"] == "slow_link"
    assert set(links["exclude"]) <= {"ls1", "ls2"} and links["exclude"]


def test_node_dropping_out_is_named_within_the_timeout(bed4):
    timeout = 30
    env = {3: {"LOCKSTEP_LINKS_FAULT": "hang:2"}}  # rank 3 stops answering at round 2
    procs, report, exclude = preflight(bed4, "drop", timeout=timeout, env=env, port=29514)
    hung = procs.pop(3)
    start = time.monotonic()
    try:
        results = bed4.wait_all(procs, WAIT)
    finally:
        hung.kill_tree()
        hung.communicate()
    waited = time.monotonic() - start
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed4.names[:3], 3), {
        n: r.stdout[-1500:] + r.stderr[-1500:] for n, r in results.items()
    }
    data = json.loads(report.read_text())
    assert data["finding"] == "dropped" and data["exit_code"] == 3
    assert data["links"]["dropped"] == ["ls3"]
    assert exclude.read_text().strip() == "ls3"
    assert "ls3" in results["ls0"].stdout and "dropped out" in results["ls0"].stdout
    # start-up (torch imports on a busy runner) + the stage's timeout and grace, never a hang
    assert waited < WAIT


def test_clean_eight_nodes_name_nothing():
    need()
    with Cluster(8, env={"NO_COLOR": "1"}) as bed:
        shape(bed)
        results, data, exclude = finish(bed, *preflight(bed, "clean8"))
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed.names, 0), {
        n: r.stdout[-1500:] + r.stderr[-1500:] for n, r in results.items()
    }
    links = data["links"]
    assert links["slow_nodes"] == [] and links["slow_links"] == [] and exclude == ""
    assert len(links["links"]) == 28
