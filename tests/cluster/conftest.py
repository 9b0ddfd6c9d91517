"""The cluster tier: tests on a bed of namespace nodes (lockstep_testbed), with real torchrun,
Slurm and Open MPI on it. Marked `cluster` and left out of the CPU tier: they run when selected,
with `pytest -m cluster` (`nox -s cluster`) or by naming tests/cluster.

Where no bed can be built (not root, no unshare/ip, no network namespaces, no Slurm or Open MPI
installed: ci/install-cluster.sh) they skip with a one-line reason, except under
LOCKSTEP_REQUIRE_CLUSTER=1, where that is an error.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lockstep_testbed import Cluster, OpenMPI, Slurm, unavailable
from lockstep_testbed.mpi import TOOLS as MPI_TOOLS
from lockstep_testbed.slurm import DAEMONS as SLURM_DAEMONS

HERE = Path(__file__).resolve().parent
_REASON: dict[str, str | None] = {}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster: cluster tier on namespace nodes (pytest -m cluster, nox -s cluster)"
    )


# The longest modules first (their walls with three workers, docs/benchmarks.md): pytest-xdist's
# loadfile with --no-loadscope-reorder (`nox -s cluster`) hands a free worker the next module in
# collection order, so the longest must not come last.
LONGEST_FIRST = (
    "test_faults.py",
    "test_links.py",
    "test_eight_nodes.py",
    "test_elastic_multinode.py",
    "test_train_multinode.py",
    "test_launchers.py",
    "test_multinode_launch.py",
    "test_prestart.py",
    "test_recipe_sbatch.py",
)


def pytest_collection_modifyitems(config, items):
    """Keep the cluster tier out of a plain `pytest` of the whole tree (the CPU tier); when it
    is chosen, its modules longest first."""
    chosen = "cluster" in (config.option.markexpr or "") or any(
        p == HERE or HERE in p.parents
        for p in (Path(a.split("::")[0]).resolve() for a in config.args)
    )
    if chosen:
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-module order
        return
    dropped = [item for item in items if item.get_closest_marker("cluster")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("cluster")]


def need(*tools: str) -> None:
    """Skip (or fail under LOCKSTEP_REQUIRE_CLUSTER=1) where no bed, or a tool, is missing."""
    if "bed" not in _REASON:
        _REASON["bed"] = unavailable()
    reason = _REASON["bed"]
    missing = [t for t in tools if shutil.which(t) is None]
    if reason is None and missing:
        reason = f"the cluster tier needs {', '.join(missing)} (ci/install-cluster.sh)"
    if reason is None:
        return
    if os.environ.get("LOCKSTEP_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"LOCKSTEP_REQUIRE_CLUSTER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bed_env():
    """Every bed's own variables: no colour in the outputs the tests read, and this process's
    PYTHONPATH where it has one, so the nodes import the lockstep this test imports (a
    worktree's src ahead of the venv's editable install)."""
    path = os.environ.get("PYTHONPATH")
    return {"NO_COLOR": "1", **({"PYTHONPATH": path} if path else {})}


@pytest.fixture
def bed_available():
    need()


@pytest.fixture
def slurm_available():
    need(*SLURM_DAEMONS[:3])


@pytest.fixture(scope="module")
def cluster(request, bed_env):
    """A bed shared by a module's tests (Slurm on it: `slurm`; Open MPI: `mpi`): 4 nodes, or
    the module's `BED_NODES`."""
    need()
    with Cluster(getattr(request.module, "BED_NODES", 4), env=bed_env) as bed:
        yield bed


@pytest.fixture(scope="module")
def slurm(cluster):
    """Slurm's daemons on the module's bed, from its first test that asks to its end."""
    need(*SLURM_DAEMONS[:3])
    with Slurm(cluster) as daemons:
        yield daemons


@pytest.fixture(scope="module")
def mpi(cluster):
    """Open MPI on the module's bed (nothing runs between its jobs)."""
    need(*MPI_TOOLS)
    return OpenMPI(cluster)
