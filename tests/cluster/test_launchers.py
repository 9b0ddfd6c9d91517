"""Clean 4 nodes x 2 ranks: `lockstep preflight` passes under the real torchrun (one agent per
node, c10d rendezvous on ls0), srun (slurmctld + one slurmd per node) and mpirun (orted on each
node through a namespace-entering remote agent), and its report groups the ranks by their real
hostnames and addresses: 8 ranks on 4 nodes under every launcher. The link stage runs by default
(the ranks span 4 hosts) and names nothing: these are the launches where, before the stage
measured CPU starvation, a clean srun launch on this 2-core machine named a slow link."""

from __future__ import annotations

import json

import pytest

from lockstep_testbed import Cluster
from lockstep_testbed.launch import torchrun

pytestmark = pytest.mark.cluster

TIMEOUT = 240  # 8 ranks importing torch on a small, busy runner; preflight's own --timeout below
# The job key every rank gets from its launcher (docs/preflight.md): with it the verdict is PASS,
# without it UNAUTHENTICATED.
KEY = {"LOCKSTEP_JOB_KEY": "5f0c" * 16}


def preflight(bed: Cluster, launcher: str) -> list[str]:
    report = bed.shared / f"{launcher}.json"
    args = ["preflight", "--timeout", "120", "--json", str(report)]
    return [bed.python, "-m", "lockstep", *args]


def check_report(bed: Cluster, launcher: str, name: str, outputs: list[str]) -> None:
    data = json.loads((bed.shared / f"{launcher}.json").read_text())
    assert data["ok"] and data["exit_code"] == 0 and data["launcher"] == name
    assert data["world_size"] == 8
    nodes = sorted(data["nodes"], key=lambda n: n["host"])
    assert [n["host"] for n in nodes] == bed.names
    assert [n["addresses"] for n in nodes] == [[bed.address(k)] for k in range(4)]
    assert sorted(r for n in nodes for r in n["ranks"]) == list(range(8))
    assert all(len(n["ranks"]) == 2 for n in nodes)
    assert sum(f"PASS: 8 ranks on 4 nodes, {name}" in out for out in outputs) == 1, outputs
    links = data["links"]  # on by default across hosts
    assert sorted(n["host"] for n in links["nodes"]) == bed.names and len(links["links"]) == 6
    assert links["kind"] is None and links["slow_nodes"] == [] and links["slow_links"] == []


def test_preflight_under_torchrun_on_four_nodes(cluster):
    argv = preflight(cluster, "torchrun")[1:]  # torchrun runs `-m lockstep ...` itself
    results = torchrun(cluster, argv, nproc_per_node=2, timeout=TIMEOUT, env=KEY)
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(cluster.names, 0), {
        n: r.stderr[-2000:] for n, r in results.items()
    }
    check_report(cluster, "torchrun", "torchelastic", [r.stdout for r in results.values()])


def test_preflight_under_srun_on_four_nodes(cluster, slurm):
    result = slurm.srun(preflight(cluster, "srun"), ntasks_per_node=2, timeout=TIMEOUT, env=KEY)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    check_report(cluster, "srun", "slurm", [result.stdout])


def test_preflight_under_mpirun_on_four_nodes(cluster, mpi):
    """The report said "8 ranks on 8 nodes" here while lockstep took Open MPI's
    OMPI_COMM_WORLD_NODE_RANK (the rank on the node) for the node's index."""
    env = {"MASTER_ADDR": cluster.hostname(0), "MASTER_PORT": "29500", **KEY}
    result = mpi.mpirun(preflight(cluster, "mpirun"), per_node=2, env=env, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    check_report(cluster, "mpirun", "openmpi", [result.stdout])
