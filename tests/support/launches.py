"""Launcher variables recorded from the real launchers on the 4-node bed
(tests/launch/data/launcher_vars_*.json, `PYTHONPATH=testbed python -m lockstep_testbed.record
tests/launch/data`: srun -N4 --ntasks-per-node 2, mpirun -H ls0:2,ls1:2,ls2:2,ls3:2, torchrun
--nnodes 4 --nproc-per-node 2), never written by hand, and the Kubeflow variables as the
operator sets them."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "launch" / "data"
MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
RECORDED = {"slurm": "slurm", "openmpi": "openmpi", "torchrun": "torchelastic"}


def recorded(launcher: str) -> dict:
    return json.loads((DATA / f"launcher_vars_{launcher}.json").read_text())


def recorded_rank(launcher: str, rank: int) -> dict[str, str]:
    return dict(recorded(launcher)["ranks"][rank]["env"])


# rank 3 of the real `srun -N4 --ntasks-per-node 2` (on ls1), no MASTER_ADDR/MASTER_PORT
SRUN = recorded_rank("slurm", 3)
# rank 2 of the real `mpirun -H ls0:2,ls1:2,ls2:2,ls3:2 -x MASTER_ADDR -x MASTER_PORT` (on ls1)
MPIRUN = recorded_rank("openmpi", 2)

SLURM_RANK = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}
KUBEFLOW_V1 = {  # what training-operator v1's setPodEnv gives worker 0 of 1 master + 3 workers
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "job-master-0",
    "PET_MASTER_PORT": "23456",
    "WORLD_SIZE": "8",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "4",
    "PYTHONUNBUFFERED": "0",
}
