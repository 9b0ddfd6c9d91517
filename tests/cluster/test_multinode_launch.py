"""`lockstep preflight --nnodes 4 --node-rank K --nproc-per-node 2 --rdzv-endpoint ls0:PORT`
on 4 namespace nodes: preflight's own multi-node launch, through torchrun's launcher API.

The issue's case: with plain `torchrun --nnodes 4 ... -m lockstep preflight`, a node that cannot
resolve its own hostname ends its agent with a `socket.gaierror` traceback and the three other
agents wait, silent, for the 600 s join timeout. Here every node checks in with node 0 first, so
all the nodes that reached it print the same line naming ls2 and exit non-zero within --timeout.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from lockstep_testbed import Cluster
from lockstep_testbed.launch import start_torchrun

pytestmark = pytest.mark.cluster

PORT = 29400


def launch(bed: Cluster, nodes, timeout: int, *extra: str) -> dict:
    """Start `lockstep preflight --nnodes 4 ...` on `nodes` (the others never start)."""
    return {
        k: bed.popen(
            k,
            [
                *(bed.python, "-m", "lockstep", "preflight", "--nnodes", "4"),
                *("--node-rank", str(k), "--nproc-per-node", "2"),
                *("--rdzv-endpoint", f"{bed.hostname(0)}:{PORT}", "--timeout", str(timeout)),
                # these tests are about the node boundary; link timings on a loaded runner
                # are the link stage's own tests' business (test_links.py)
                "--no-links",
                *extra,
            ],
            stderr=subprocess.PIPE,
        )
        for k in nodes
    }


@pytest.fixture
def clean(cluster):
    yield cluster
    for k, name in enumerate(cluster.names):
        cluster.node_env[name].clear()
        cluster.write_hosts(k, cluster.state_path("hosts").read_text())
        if cluster.interface(k) != "eth0":
            cluster.rename_interface(k, "eth0")
    cluster.write_profiles()


def test_clean_four_nodes_pass_through_the_check_in_and_torchrun(clean):
    bed = clean
    report = bed.shared / "multinode.json"
    results = bed.wait_all(launch(bed, range(4), 60, "--json", str(report)), timeout=240)
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed.names, 0), out
    data = json.loads(report.read_text())
    assert data["ok"] and data["launcher"] == "torchelastic" and data["world_size"] == 8
    assert sorted(n["host"] for n in data["nodes"]) == bed.names
    assert all(len(n["ranks"]) == 2 for n in data["nodes"])


def test_torchrun_alone_with_a_node_that_cannot_resolve_itself(clean):
    """What the issue saw, kept as the launcher's own behaviour (docs/slurm.md states it):
    ls2's agent dies with socket.gaierror, the others keep waiting in the rendezvous."""
    bed = clean
    bed.drop_host(2, "ls2")
    (bed.shared / "noop.py").write_text("pass\n")
    procs = start_torchrun(bed, [str(bed.shared / "noop.py")], nproc_per_node=1, port=PORT + 10)
    try:
        assert procs[2].wait(timeout=60) != 0
        assert "gaierror" in procs[2].stderr.read()
        time.sleep(2)
        assert all(procs[k].poll() is None for k in (0, 1, 3))  # still waiting, silent
    finally:
        for p in procs.values():
            p.kill_tree()
            p.communicate()


def test_nodes_that_cannot_start_are_named_by_every_node_within_the_timeout(clean):
    """ls2 cannot resolve its own hostname (the issue's case) and ls3 has no eth0 while
    GLOO_SOCKET_IFNAME=eth0: every node prints the one line naming both, exit 1."""
    bed = clean
    bed.drop_host(2, "ls2")
    bed.rename_interface(3, "ens5")
    for name in bed.names:
        bed.node_env[name]["GLOO_SOCKET_IFNAME"] = "eth0"
    start = time.monotonic()
    results = bed.wait_all(launch(bed, range(4), 20), timeout=120)
    elapsed = time.monotonic() - start
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed.names, 1), out
    for text in out.values():
        assert "ls2 (node 2, ranks 4-5): its hostname ls2 does not resolve" in text, text
        assert "ls3 (node 3, ranks 6-7): GLOO_SOCKET_IFNAME names eth0, absent here" in text
        assert "Traceback" not in text
    assert elapsed < 20 + 40  # the check-in does not wait for the timeout when all arrived


def test_a_node_that_never_joins_is_named_within_the_timeout(clean):
    bed = clean
    start = time.monotonic()
    results = bed.wait_all(launch(bed, range(3), 8), timeout=90)
    elapsed = time.monotonic() - start
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(bed.names[:3], 3), out
    for text in out.values():
        assert "node 3 (ranks 6-7) never checked in within 8s" in text, text
    assert elapsed < 8 + 40
