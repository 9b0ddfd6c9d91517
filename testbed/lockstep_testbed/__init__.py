"""A cluster in a box: N nodes as Linux namespaces on one machine, with real launchers on them.

    from lockstep_testbed import Cluster, OpenMPI, Slurm
    from lockstep_testbed.launch import torchrun
    with Cluster(nodes=4) as bed, Slurm(bed) as slurm:
        bed.run(0, ["hostname"])                       # -> "ls0"
        torchrun(bed, ["-m", "lockstep", "preflight"])  # one agent per node
        slurm.srun(["python", "-m", "lockstep", "preflight"], ntasks_per_node=2)
        OpenMPI(bed).mpirun(["python", "-m", "lockstep", "preflight"], per_node=2)

The bed knows no service: its caller composes them on it.
- `bed.py`: `Cluster`, the nodes (built and torn down by themselves, even after SIGKILL of the
  caller: `namespaces.py`), their names and addresses, commands on them;
  its fault hooks: `configuration.py` (a node's environment, hosts file, packages) and
  `network.py` (interfaces, links, shaping);
- `processes.py`: the host's view of the bed's processes (trees, `NodeProcess`, output tails);
- `slurm.py`: `Slurm(bed)`, munged/slurmctld/slurmd on the nodes; `mpi.py`: `OpenMPI(bed)`,
  Open MPI's mpirun with a remote agent that enters a node's namespaces instead of ssh;
  `launch.py`: torchrun's agents; `record.py`: the launcher variables tests/launch/ reads.
`ci/install-cluster.sh` installs what it needs from Debian. Development only, never in the
wheel: pytest (pyproject.toml's `pythonpath`) and the benchmarks put testbed/ on sys.path
(elsewhere: `PYTHONPATH=testbed`); its import rules: testbed/importlinter.toml.
"""

from lockstep_testbed.bed import Cluster
from lockstep_testbed.errors import BedError, NodeTimeout
from lockstep_testbed.mpi import OpenMPI
from lockstep_testbed.namespaces import HEAD, unavailable
from lockstep_testbed.slurm import Slurm

__all__ = ["HEAD", "BedError", "Cluster", "NodeTimeout", "OpenMPI", "Slurm", "unavailable"]
