"""A cluster in a box: N nodes as Linux namespaces on one machine, with real launchers on them.

    from lockstep.cluster import Cluster
    with Cluster(nodes=4, slurm=True) as bed:
        bed.run(0, ["hostname"])                       # -> "ls0"
        torchrun(bed, ["-m", "lockstep", "preflight"])  # one agent per node
        bed.slurm.srun(["python", "-m", "lockstep", "preflight"], ntasks_per_node=2)
        mpirun(bed, ["python", "-m", "lockstep", "preflight"], per_node=2)

`bed.py` builds the nodes (and tears them down by itself, even after SIGKILL of the caller),
`slurm.py` runs munged/slurmctld/slurmd on them, `mpi.py` runs Open MPI's mpirun with a remote
agent that enters a node's namespaces instead of ssh, `launch.py` starts torchrun's agents.
`ci/install-cluster.sh` installs what it needs from Debian; tests/cluster/ uses it.
"""

from lockstep.cluster.bed import HEAD, BedError, Cluster, NodeTimeout, unavailable

__all__ = ["HEAD", "BedError", "Cluster", "NodeTimeout", "unavailable"]
