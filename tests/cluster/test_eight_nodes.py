"""Preflight with its link stage on 8 namespace nodes under each launcher the bed runs (issue
38: the cluster tier runs one clean and one fault run per size, srun, mpirun and torchrun). One
8-node bed for the module, one rank per node (8 Pythons importing torch on two busy cores; the
4-node launches of test_launchers.py and test_links.py carry 2 ranks a node and the other
faults):

- clean under srun: nothing named, every rank exit 0, a PASS with 28 links measured;
- one node's veth at a fifth under torchrun: that node named slow (not its 7 partners), every
  rank exit 1, the report's `kind` "node" and `drain` that node alone with its `lockstep:` reason;
- one link at a fifth between two nodes under mpirun: that pair named as a link, no node slow,
  exit 1, `kind` "node", `drain` within the pair.
"""

from __future__ import annotations

import json

import pytest

import lockstep
from lockstep.launch.hostlist import expand
from lockstep_testbed import Cluster
from lockstep_testbed.launch import torchrun
from lockstep_testbed.network import LINK_BURST

pytestmark = pytest.mark.cluster

BED_NODES = NODES = 8  # conftest's `cluster`: this module's bed
TIMEOUT = 240  # 8 ranks importing torch on a small, busy runner; preflight's own --timeout below
KEY = {"LOCKSTEP_JOB_KEY": "5f0c" * 16}  # what a launcher gives every rank: the verdict is a PASS


def fifth(rate: str) -> str:
    """A fifth of a tc rate ("1gbit" -> "200000kbit")."""
    for unit, scale in (("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)):
        if rate.endswith(unit):
            return f"{int(float(rate[: -len(unit)]) * scale / 5 / 1e3)}kbit"
    raise ValueError(f"rate {rate!r}: kbit, mbit or gbit")


def argv(bed: Cluster, name: str) -> list[str]:
    report = bed.shared / f"{name}.json"
    exclude = bed.shared / f"{name}.exclude"
    args = ["preflight", "--timeout", "120", "--json", str(report), "--exclude-out", str(exclude)]
    return [bed.python, "-m", "lockstep", *args]


def outcome(bed: Cluster, name: str) -> tuple[dict, str]:
    """Rank 0's report and its exclude list."""
    data = json.loads((bed.shared / f"{name}.json").read_text())
    return data, (bed.shared / f"{name}.exclude").read_text().strip()


def test_the_nodes_import_this_lockstep(cluster):
    """The bed's Python on a node imports the lockstep this test does (PYTHONPATH forwarded:
    conftest's `bed_env`), so the verdicts below are this checkout's."""
    probe = [cluster.python, "-c", "import lockstep; print(lockstep.__file__)"]
    result = cluster.run(NODES - 1, probe, timeout=60)
    assert result.stdout.strip() == lockstep.__file__, result.stdout + result.stderr


def test_clean_eight_nodes_under_srun_name_nothing(cluster, slurm):
    result = slurm.srun(argv(cluster, "clean8-srun"), ntasks_per_node=1, timeout=TIMEOUT, env=KEY)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    data, exclude = outcome(cluster, "clean8-srun")
    assert data["ok"] and data["exit_code"] == 0 and data["launcher"] == "slurm"
    assert data["world_size"] == NODES and data["kind"] is None and data["drain"] == []
    assert sorted(n["host"] for n in data["nodes"]) == cluster.names
    links = data["links"]
    assert links["finding"] is None and links["kind"] is None
    assert links["slow_nodes"] == [] and links["slow_links"] == [] and exclude == ""
    assert len(links["links"]) == 28 and links["schedule"] == "full"
    assert f"PASS: {NODES} ranks on {NODES} nodes, slurm" in result.stdout, result.stdout[-3000:]


def test_slow_node_of_eight_under_torchrun_named_and_drained(cluster):
    cluster.rate_limit(5, fifth(cluster.link_rate), burst=LINK_BURST)
    try:
        results = torchrun(cluster, argv(cluster, "slownode8")[1:], env=KEY, timeout=TIMEOUT)
    finally:
        cluster.clear_rate_limit(5)  # back to the bed's own shaping
    out = "".join(r.stdout + r.stderr for r in results.values())
    # torchrun's agent exits 1 when its worker failed; the ranks' own code is 1 (a verdict)
    assert {r.returncode for r in results.values()} == {1}, out[-3000:]
    assert "exitcode  : 1" in out and "exitcode  : 3" not in out, out[-3000:]
    data, exclude = outcome(cluster, "slownode8")
    links = data["links"]
    assert [s["host"] for s in links["slow_nodes"]] == ["ls5"], links["slow_nodes"]
    assert links["slow_links"] == [] and exclude == "ls5"
    assert data["finding"] == "slow_node" and data["exit_code"] == 1 and not data["ok"]
    assert data["kind"] == "node" and links["kind"] == "node"
    assert data["drain"] == [{"host": "ls5", "reason": "lockstep: slow node ls5"}], data["drain"]
    assert data["drain_hostlist"] == "ls5"
    (node,) = links["slow_nodes"]
    assert node["slow_links"] >= 2 and node["confirmed_links"] >= 1, node
    assert node["margin_gbps"] >= links["rails"][0]["min_margin_gbps"] > 0, links["rails"]
    assert "slow node ls5" in results["ls0"].stdout


def test_slow_link_of_eight_under_mpirun_named_as_a_link(cluster, mpi):
    rate = cluster.link_rate
    cluster.rate_limit_pair(3, 6, fifth(rate), others=rate, burst=LINK_BURST)
    env = {"MASTER_ADDR": cluster.hostname(0), "MASTER_PORT": "29500", **KEY}
    try:
        result = mpi.mpirun(argv(cluster, "slowlink8"), per_node=1, env=env, timeout=TIMEOUT)
    finally:
        for k in (3, 6):
            cluster.clear_rate_limit(k)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    data, exclude = outcome(cluster, "slowlink8")
    assert data["launcher"] == "openmpi" and data["world_size"] == NODES
    links = data["links"]
    assert links["slow_nodes"] == [], links["slow_nodes"]
    assert [sorted(s["hosts"]) for s in links["slow_links"]] == [["ls3", "ls6"]], links
    assert data["finding"] == "slow_link" and data["exit_code"] == 1
    slow = links["slow_links"][0]
    assert slow["gbps"] < 0.4 * slow["typical_gbps"]
    assert slow["measurements"] >= 2 and slow["noise_gbps"] < slow["margin_gbps"], slow
    assert data["kind"] == "node"
    drained = [d["host"] for d in data["drain"]]
    assert drained and set(drained) <= {"ls3", "ls6"}, data["drain"]
    assert (
        sorted(drained) == sorted(links["exclude"]) == sorted(expand(exclude))
    )  # a Slurm host list
    assert all(d["reason"] == "lockstep: slow link ls3<->ls6" for d in data["drain"]), data
    assert "slow link ls3" in result.stdout, result.stdout[-3000:]
