"""Record the variables real launchers set, on the bed: the tables tests/launch/ reads.

    PYTHONPATH=testbed python -m lockstep_testbed.record tests/launch/data  # root; ci/install-cluster.sh

Runs a script that dumps its launcher variables as JSON under `srun -N4 --ntasks-per-node 2`,
`mpirun -H ls0:2,ls1:2,ls2:2,ls3:2` and `torchrun --nnodes 4 --nproc-per-node 2` (c10d) on a
4-node bed, and writes `launcher_vars_{slurm,openmpi,torchrun}.json`: the command, the
launcher's version, and every rank's hostname and variables, ordered by rank.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path

from lockstep_testbed import mpi, slurm
from lockstep_testbed.bed import Cluster
from lockstep_testbed.errors import BedError
from lockstep_testbed.launch import torchrun, torchrun_command
from lockstep_testbed.mpi import OpenMPI
from lockstep_testbed.slurm import Slurm

NODES, PER_NODE = 4, 2
PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "PMIX_RANK", "TORCHELASTIC_")
NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)
RANK_VARIABLE = {"slurm": "SLURM_PROCID", "openmpi": "OMPI_COMM_WORLD_RANK", "torchrun": "RANK"}
_SCRIPT = f"""\
import json, os, socket, sys
keep = {{n: v for n, v in os.environ.items() if n.startswith({PREFIXES!r}) or n in {NAMES!r}}}
record = {{"host": socket.gethostname(), "env": dict(sorted(keep.items()))}}
with open(os.path.join(sys.argv[1], f"{{socket.gethostname()}}-{{os.getpid()}}.json"), "w") as f:
    json.dump(record, f)
"""


def record(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with Cluster(NODES) as bed, Slurm(bed) as slurm_daemons:
        script = bed.shared / "record_env.py"
        script.write_text(_SCRIPT)
        torch_version = bed.run(
            0, [bed.python, "-c", "import torch; print(torch.__version__)"], check=True
        ).stdout.strip()
        base = {
            "recorded_with": "PYTHONPATH=testbed python -m lockstep_testbed.record tests/launch/data",
            "bed": f"{NODES} namespace nodes (lockstep_testbed), {PER_NODE} ranks per node",
            "debian": Path("/etc/debian_version").read_text().strip()
            if Path("/etc/debian_version").exists()
            else platform.platform(),
            "python": platform.python_version(),
        }

        def where(launcher: str) -> Path:
            path = bed.shared / launcher
            path.mkdir()
            return path

        argv = [bed.python, str(script), str(where("slurm"))]
        result = slurm_daemons.srun(argv, ntasks_per_node=PER_NODE, timeout=60)
        cmd = slurm_daemons.srun_command(argv, ntasks_per_node=PER_NODE)
        versions = {"slurm": slurm.version()}
        written.append(_write(out, bed, "slurm", base | versions, cmd, result))

        env = {"MASTER_ADDR": bed.hostname(0), "MASTER_PORT": "29500"}
        argv = [bed.python, str(script), str(where("openmpi"))]
        open_mpi = OpenMPI(bed)
        result = open_mpi.mpirun(argv, per_node=PER_NODE, env=env, timeout=60)
        cmd = open_mpi.mpirun_command(argv, per_node=PER_NODE, export=sorted(env))
        versions = {"open_mpi": mpi.version()}
        written.append(_write(out, bed, "openmpi", base | versions, cmd, result))

        argv = [str(script), str(where("torchrun"))]
        results = torchrun(bed, argv, nproc_per_node=PER_NODE, timeout=90)
        cmd = torchrun_command(bed, argv, nproc_per_node=PER_NODE)
        bad = [r for r in results.values() if r.returncode]
        versions = {"torch": torch_version}
        written.append(_write(out, bed, "torchrun", base | versions, cmd, bad[0] if bad else None))
    return written


def _write(out: Path, bed: Cluster, launcher: str, versions: dict, cmd: list[str], failed) -> Path:
    if failed is not None and failed.returncode:
        raise BedError(
            f"{launcher}: `{shlex.join(cmd)}` exited {failed.returncode}: "
            f"{(failed.stderr or failed.stdout)[-500:]}"
        )
    ranks = [json.loads(p.read_text()) for p in (bed.shared / launcher).glob("*.json")]
    ranks.sort(key=lambda r: int(r["env"][RANK_VARIABLE[launcher]]))
    if len(ranks) != NODES * PER_NODE:
        raise BedError(f"{launcher}: {len(ranks)} ranks recorded, expected {NODES * PER_NODE}")
    shown = [Path(c).name if c.startswith("/") else c for c in cmd]
    data = {"launcher": launcher, "command": shlex.join(shown), **versions, "ranks": ranks}
    path = out / f"launcher_vars_{launcher}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lockstep_testbed.record OUT_DIR", file=sys.stderr)
        return 2
    for path in record(Path(args[0])):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
