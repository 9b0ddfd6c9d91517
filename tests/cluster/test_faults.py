"""Faults that strike after the ranks start, on 4 namespace nodes x 2 ranks: each gets exit 1
or 3 from every launcher, naming the node (hostname), the ranks on it and the field or cause.

One launch checks several faults where they do not hide each other (a drifted variable on ls1
and a drifted package on ls2 are two outlier groups of one comparison); every fault is undone
after its test, on a bed shared by the module. Faults before any rank starts (a node whose
torchrun agent cannot start or never arrives) are preflight's own multi-node launch's part:
test_multinode_launch.py.
"""

from __future__ import annotations

import json
import time

import pytest

from lockstep_testbed import Cluster, OpenMPI, Slurm
from lockstep_testbed.launch import start_torchrun, torchrun

pytestmark = pytest.mark.cluster

TIMEOUT = 240  # the launch as a whole; preflight's own --timeout is in each argv


def preflight(bed: Cluster, name: str, timeout: int = 60) -> list[str]:
    report = bed.shared / f"{name}.json"
    return [
        bed.python,
        "-m",
        "lockstep",
        "preflight",
        "--timeout",
        str(timeout),
        "--json",
        str(report),
        # these tests are about the node boundary; link timings on a loaded runner are the
        # link stage's own tests' business (test_links.py)
        "--no-links",
    ]


def run(
    bed: Cluster, launcher: str | Slurm | OpenMPI, name: str, env=None, timeout: int = 60
) -> tuple[set, str]:
    """(exit codes, every output) of preflight on all 4 nodes x 2 ranks under `launcher`:
    "torchrun", or the module's Slurm or Open MPI."""
    argv = preflight(bed, name, timeout)
    if launcher == "torchrun":
        results = torchrun(bed, argv[1:], nproc_per_node=2, env=env, timeout=TIMEOUT)
        return {r.returncode for r in results.values()}, "".join(
            r.stdout + r.stderr for r in results.values()
        )
    if isinstance(launcher, Slurm):
        result = launcher.srun(argv, ntasks_per_node=2, env=env, timeout=TIMEOUT)
    else:
        env = {"MASTER_ADDR": bed.hostname(0), "MASTER_PORT": "29500", **(env or {})}
        result = launcher.mpirun(argv, per_node=2, env=env, timeout=TIMEOUT)
    return {result.returncode}, result.stdout + result.stderr


def report(bed: Cluster, name: str) -> dict:
    return json.loads((bed.shared / f"{name}.json").read_text())


@pytest.fixture
def clean(cluster):
    """The module's bed; every fault planted in the test undone after it."""
    yield cluster
    for k, name in enumerate(cluster.names):
        cluster.node_env[name].clear()
        cluster.remove_overlays(k)
        cluster.write_hosts(k, cluster.state_path("hosts").read_text())
        if cluster.interface(k) != "eth0":
            cluster.rename_interface(k, "eth0")
        cluster.link(k, up=True)
    cluster.write_profiles()


@pytest.fixture
def via(request, launcher):
    """What `run` starts preflight with under the test's `launcher`: "torchrun", or the
    module's Slurm or Open MPI (conftest's fixtures, Slurm started when first asked)."""
    fixture = {"srun": "slurm", "mpirun": "mpi"}.get(launcher)
    return request.getfixturevalue(fixture) if fixture else launcher


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun"])
def test_environment_and_package_drift_on_one_node_each(clean, launcher, via):
    """NCCL_ALGO set on ls1 only, and ls2's venv with another `packaging`: the same verdict
    from all three launchers, naming each node, its ranks and the field."""
    bed = clean
    bed.set_node_env(1, NCCL_ALGO="Ring")
    bed.overlay_package(2, "packaging", "0.0.1")
    codes, out = run(bed, via, f"drift-{launcher}")
    assert codes == {1}, out[-3000:]
    data = report(bed, f"drift-{launcher}")
    lines = " | ".join(data["problems"])
    assert "rank 2-3 on ls1 differ from the majority in env.NCCL_ALGO" in lines, lines
    assert "rank 4-5 on ls2 differ from the majority in packages." in lines, lines
    assert data["failed_hosts"] == ["ls1", "ls2"]
    assert "rank 2-3 on ls1 differ" in out  # the console says it too


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_unresolvable_hostname_and_missing_interface_stop_at_the_check_in(clean, launcher, via):
    """ls2 cannot resolve its own name (gloo picks its address from it) and ls3 has no eth0
    while GLOO_SOCKET_IFNAME=eth0: both would break the process group on their node, so the
    check-in stops every rank at once, naming both. (Under torchrun the agent on ls2 dies in
    its rendezvous before any rank runs: test_multinode_launch.py.)"""
    bed = clean
    bed.drop_host(2, "ls2")
    bed.rename_interface(3, "ens5")
    start = time.monotonic()
    codes, out = run(bed, via, f"blocked-{launcher}", env={"GLOO_SOCKET_IFNAME": "eth0"})
    assert codes == {1}, out[-3000:]
    data = report(bed, f"blocked-{launcher}")
    assert data["stage"] == "check-in" and data["failed_hosts"] == ["ls2", "ls3"]
    assert "hostname on ls2 rank 4-5: own hostname 'ls2' does not resolve" in data["line"]
    assert "gloo_socket_ifname on ls3 rank 6-7: GLOO_SOCKET_IFNAME names eth0" in data["line"]
    assert out.count("preflight stopped at the check-in") >= 1, out[-2000:]
    assert time.monotonic() - start < 150  # a loaded 2-core runner; no wait on a timeout


def test_a_link_down_mid_preflight_names_the_node(clean):
    """ls2's link, slowed so the all_reduce timings take a while, goes down once its ranks
    have connected to their peers: the ranks elsewhere give up after --timeout and name
    the ranks that stopped answering, ls2's, with its address; exit 3, never a hang."""
    bed = clean
    bed.rate_limit(2, "20mbit", "64kbit")
    try:
        procs = start_torchrun(
            bed, preflight(bed, "linkdown", timeout=15)[1:], nproc_per_node=2, port=29400
        )
        others = {bed.address(k) for k in (0, 1, 3)}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # gloo's pairs up: peers on ports other than 29400
            if any(a in others and 29400 not in (lp, pp) for lp, a, pp in bed.tcp_peers(2)):
                break
            time.sleep(0.2)
        else:
            pytest.fail("ls2's ranks never connected to their peers")
        bed.link(2, up=False)
        start = time.monotonic()
        results = bed.wait_all({k: procs[k] for k in (0, 1, 3)}, timeout=120)
        elapsed = time.monotonic() - start
        bed.link(2, up=True)
        bed.wait_all({2: procs[2]}, timeout=120)
    finally:
        bed.clear_rate_limit(2)
    out = "".join(r.stdout + r.stderr for r in results.values())
    # torchrun's agent exits 1 whenever a worker failed; the ranks' own code is 3
    assert {r.returncode for r in results.values()} == {1}, out[-3000:]
    assert "exitcode  : 3" in out and "exitcode  : 1" not in out, out[-3000:]
    assert f"ranks 4-5 on ls2 ({bed.address(2)}) stopped answering" in out, out[-3000:]
    assert elapsed < 2 * 15 + 60  # gloo's timeout, then the others' wait for each other
