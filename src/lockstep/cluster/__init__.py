"""A cluster in a box: N nodes as Linux namespaces on one machine, with real launchers on them.

    from lockstep.cluster import Cluster, OpenMPI, Slurm
    from lockstep.cluster.launch import torchrun
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
  `launch.py`: torchrun's agents; `record.py`: the launcher variables tests/env/ reads.
`ci/install-cluster.sh` installs what it needs from Debian; tests/cluster/ uses it.
"""

from lockstep.cluster.bed import Cluster
from lockstep.cluster.errors import BedError, NodeTimeout
from lockstep.cluster.mpi import OpenMPI
from lockstep.cluster.namespaces import HEAD, unavailable
from lockstep.cluster.slurm import Slurm

__all__ = ["HEAD", "BedError", "Cluster", "NodeTimeout", "OpenMPI", "Slurm", "unavailable"]
