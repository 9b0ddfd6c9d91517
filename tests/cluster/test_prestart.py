"""Faults that strike before any rank starts, under each launcher by itself: the first row of
docs/slurm.md's table ("a node without its daemon"), proved on the bed with short timeouts.

- srun, ls3's slurmd killed: while slurmctld still counts the node (until `SlurmdTimeout`) the
  job gets it and the step fails at its task launch, naming ls3; once the node is DOWN the job
  pends for resources and srun waits, silent, for ever.
- mpirun, its remote agent unable to reach ls3 (ssh's exit 255): mpirun dies within seconds,
  "ORTE was unable to reliably start one or more daemons", no rank runs.
- torchrun, no agent on ls3: the other agents wait in the rendezvous, naming no node, until
  `join_timeout` (600 s by default) and then exit 1.

The other rows: a node that cannot resolve its own hostname or lacks the named interface under
srun and mpirun (test_faults.py, the check-in names both), torchrun's agent dying with
`socket.gaierror` (test_multinode_launch.py); and lockstep's own multi-node launch naming the
node that never arrives within `--timeout` (test_multinode_launch.py).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from lockstep_testbed import HEAD
from lockstep_testbed.launch import start_torchrun

pytestmark = pytest.mark.cluster


def test_srun_fails_at_the_launch_then_waits_once_the_node_is_down(cluster, slurm):
    bed = cluster
    slurm.stop_slurmd(3)
    try:
        start = time.monotonic()  # slurmctld still counts ls3: it is allocated
        result = bed.run(HEAD, slurm.srun_command(["hostname"]), env=slurm.env, timeout=90)
        elapsed = time.monotonic() - start
        assert result.returncode != 0, result
        assert "Task launch for StepId=" in result.stderr, result.stderr
        assert "failed on node ls3: Communication connection failure" in result.stderr
        assert elapsed < 60

        slurm.set_state(3, "down", "slurmd not responding")  # what SlurmdTimeout would do
        srun = bed.popen(
            HEAD, slurm.srun_command(["hostname"]), env=slurm.env, stderr=subprocess.PIPE
        )
        try:
            deadline, pending = time.monotonic() + 30, ""
            while time.monotonic() < deadline and "PENDING" not in pending:
                time.sleep(0.5)
                pending = bed.run(
                    HEAD, ["squeue", "-h", "-o", "%T %r"], env=slurm.env, timeout=10
                ).stdout
            assert "PENDING" in pending, pending
            assert slurm.node_states()["ls3"].startswith("down")
            time.sleep(2)
            assert srun.poll() is None  # still waiting in the queue
        finally:
            srun.kill_tree()
            out, err = srun.communicate(timeout=10)
            bed.run(HEAD, ["scancel", "--user=root"], env=slurm.env, timeout=10)
        assert "queued and waiting for resources" in err, err
        assert out == ""  # no task ran
    finally:
        slurm.start_slurmd(3)  # ReturnToService=2: back to idle once it registers


def test_mpirun_dies_in_its_remote_agent(cluster, mpi):
    bed = cluster
    mpi.install_agent()
    mpi.block_agent(3)
    try:
        start = time.monotonic()
        argv = mpi.mpirun_command(["hostname"], per_node=1)
        result = bed.run(HEAD, argv, timeout=60)
        elapsed = time.monotonic() - start
    finally:
        mpi.block_agent(3, blocked=False)
    assert result.returncode == 255, result
    assert "connect to host ls3" in result.stderr  # the agent's own line (ssh's, on a cluster)
    assert "ORTE was unable to reliably start one or more daemons" in result.stderr
    ran = [line for line in result.stdout.splitlines() if line.strip() in bed.names]
    assert not ran, result.stdout  # no rank printed its hostname
    assert elapsed < 30


def test_torchrun_agents_wait_in_the_rendezvous_until_its_join_timeout(cluster):
    """One agent's join times out (RendezvousTimeoutError) and it closes the rendezvous; the
    others see it closed, or lose the store when ls0's agent, which serves it, has exited."""
    bed = cluster
    join = 6
    (bed.shared / "noop.py").write_text("print('worker ran')\n")
    start = time.monotonic()
    agents = start_torchrun(
        bed,
        [str(bed.shared / "noop.py")],
        nodes=[0, 1, 2],
        port=29420,
        extra=["--rdzv-conf", f"join_timeout={join}"],
    )
    results = bed.wait_all(agents, timeout=120)
    elapsed = time.monotonic() - start
    assert {r.returncode for r in results.values()} == {1}, results
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert sum("RendezvousTimeoutError" in text for text in out.values()) >= 1, out
    ends = ("RendezvousTimeoutError", "RendezvousClosedError", "RendezvousConnectionError")
    assert all(any(e in text for e in ends) for text in out.values()), out  # see the docstring
    assert not any("ls3" in text or "worker ran" in text for text in out.values())
    assert elapsed >= join
