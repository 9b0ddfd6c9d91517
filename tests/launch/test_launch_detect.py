"""Launcher recognition: each launcher's variables, half-set and contradictory ones (no torch).

Slurm's, Open MPI's and torchrun's variables come from tables recorded from the real launchers
on a 4-node test bed (`support.launches`, tests/launch/data/); DeepSpeed's, MVAPICH's and
PMI's are written here.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from lockstep.errors import UsageError
from lockstep.launch.detect import (
    LAUNCHER_VARIABLES,
    PER_RANK_VARIABLES,
    detect,
    expand_tasks_per_node,
    first_host,
)
from support.launches import KUBEFLOW_V1, MASTER, RECORDED, SLURM_RANK, recorded, recorded_rank


@pytest.mark.parametrize("launcher", sorted(RECORDED))
def test_recorded_launch_reads_every_rank_right(launcher):
    """Every rank of a real 4 x 2 launch: its rank, the world, its place on its node, and one
    node index per host (or none, where the launcher gives none) so preflight counts 4 nodes."""
    table = recorded(launcher)
    ranks = table["ranks"]
    by_host = defaultdict(list)
    for row in ranks:
        by_host[row["host"]].append(row)
    assert len(ranks) == 8 and len(by_host) == 4
    groups = set()
    for index, row in enumerate(ranks):
        info = detect(row["env"])
        assert (info.launcher, info.rank, info.world_size) == (RECORDED[launcher], index, 8)
        on_host = [detect(r["env"]).rank for r in by_host[row["host"]]]
        assert info.local_world_size == len(on_host) == 2
        assert info.local_rank == sorted(on_host).index(info.rank)
        assert info.master_addr == "ls0"  # the first host, derived under Slurm
        groups.add((info.node_rank, row["host"]))  # how preflight's report groups ranks
    assert len(groups) == 4, f"{launcher}: ranks grouped into {len(groups)} nodes: {groups}"
    node_ranks = {node for node, _ in groups}
    assert node_ranks == ({None} if launcher == "openmpi" else {0, 1, 2, 3})


def test_open_mpi_node_rank_is_the_rank_on_the_node_not_the_node():
    """The bug the real mpirun showed: OMPI_COMM_WORLD_NODE_RANK is 0 and 1 on every node of
    `-H ls0:2,...`; read as the node's index it made preflight report 8 ranks on 8 nodes."""
    ranks = recorded("openmpi")["ranks"]
    assert {r["env"]["OMPI_COMM_WORLD_NODE_RANK"] for r in ranks} == {"0", "1"}
    assert all(detect(r["env"]).node_rank is None for r in ranks)
    assert "OMPI_COMM_WORLD_NODE_RANK" in PER_RANK_VARIABLES  # differs by design, not drift


def test_recorded_per_rank_variables_are_known():
    """A variable that differs between the ranks of a clean real launch must be one preflight
    expects to differ (PER_RANK_VARIABLES), or the comparison would flag a clean launch."""
    for launcher in RECORDED:
        ranks = recorded(launcher)["ranks"]
        differing = {
            name
            for name in set().union(*(r["env"] for r in ranks))
            if name in LAUNCHER_VARIABLES and len({r["env"].get(name) for r in ranks}) > 1
        }
        assert differing <= set(PER_RANK_VARIABLES), (launcher, differing - set(PER_RANK_VARIABLES))


def test_recorded_tables_name_their_versions():
    assert recorded("slurm")["slurm"].startswith("slurm")
    assert recorded("openmpi")["open_mpi"][0].isdigit()
    assert recorded("torchrun")["torch"][0].isdigit()


@pytest.mark.parametrize(
    ("env", "launcher", "rank", "world", "local", "local_world", "node"),
    [
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "RANK": "5",
                "WORLD_SIZE": "8",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": "1",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                **MASTER,
            },
            "torchelastic",
            5,
            8,
            1,
            4,
            1,
        ),
        (
            {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "LOCAL_SIZE": "2",
                "CROSS_RANK": "1",
                "CROSS_SIZE": "2",
                **MASTER,
            },
            "deepspeed",
            3,
            4,
            1,
            2,
            1,
        ),
        (
            # mpirun inside an allocation: Open MPI's numbers win; it has no node index
            {**recorded_rank("openmpi", 2), "SLURM_PROCID": "0", **MASTER},
            "openmpi",
            2,
            8,
            0,
            2,
            None,
        ),
        (
            {
                "MV2_COMM_WORLD_RANK": "1",
                "MV2_COMM_WORLD_SIZE": "2",
                "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "2",
                **MASTER,
            },
            "mvapich",
            1,
            2,
            1,
            2,
            None,
        ),
        ({**recorded_rank("slurm", 3), **MASTER}, "slurm", 3, 8, 1, 2, 1),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", **MASTER},
            "pmi",
            1,
            2,
            1,
            None,
            None,
        ),
        ({"PMIX_RANK": "0", "WORLD_SIZE": "2", **MASTER}, "pmix", 0, 2, None, None, None),
        ({"RANK": "1", "WORLD_SIZE": "2", **MASTER}, "manual", 1, 2, None, None, None),
    ],
)
def test_each_launcher_is_recognised(env, launcher, rank, world, local, local_world, node):
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size) == (launcher, rank, world)
    assert (info.local_rank, info.local_world_size, info.node_rank) == (local, local_world, node)
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29500)


def test_no_launcher_means_embedded():
    assert detect({"PATH": "/bin"}) is None


def test_torchelastic_agent_store_is_used():
    env = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        **MASTER,
    }
    assert detect(env).agent_store


def test_slurm_derives_master_from_node_list_and_job_id():
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NODELIST": "gpu[07-09,12],cpu1",
        "SLURM_JOB_ID": "123456",
    }
    info = detect(env)
    assert info.master_addr == "gpu07"
    assert info.master_port == 15000 + 123456 % 20000


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RANK": "0"}, "WORLD_SIZE"),
        ({"MASTER_ADDR": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT"),
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", **MASTER}, "LOCAL_RANK"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "MASTER_ADDR"),
        ({"SLURM_PROCID": "0"}, "SLURM_NTASKS"),
        ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, "outside"),
        ({"RANK": "x", "WORLD_SIZE": "2", **MASTER}, "not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, "port"),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", **MASTER},
            "contradictory",
        ),
    ],
)
def test_half_set_or_contradictory_variables_are_named(env, named):
    with pytest.raises(UsageError, match=named):
        detect(env)


def test_slurm_host_list_helpers():
    assert first_host("node1") == "node1"
    assert first_host("a[3-4]") == "a3"
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({**SLURM_RANK, "SLURM_NTASKS": "8", "SLURM_STEP_NODELIST": "ls[0-3"}, "unclosed"),
        ({**SLURM_RANK, "SLURM_NTASKS": "8", "SLURM_STEP_NODELIST": "ls[a-c]"}, "bad range"),
        (
            {
                **SLURM_RANK,
                "SLURM_NTASKS": "8",
                "SLURM_STEP_NODELIST": "ls[0-3]",
                "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
            },
            "gives 3 node",
        ),
        (
            {
                **SLURM_RANK,
                "SLURM_NTASKS": "6",
                "SLURM_STEP_NODELIST": "ls[0-3]",
                "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
            },
            "SLURM_NTASKS=6 disagrees with the host list",
        ),
        (KUBEFLOW_V1, "without torchrun: RANK=1 is the pod's index"),
    ],
)
def test_bad_cluster_input_is_named(env, named):
    with pytest.raises(UsageError, match=re.escape(named)):
        detect(env)


def test_kubeflow_variables_that_agree_pass():
    # one process per pod: RANK and WORLD_SIZE are right as they are
    info = detect({**KUBEFLOW_V1, "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "1"})
    assert (info.rank, info.world_size, info.master_addr) == (1, 4, "job-master-0")
    # torchrun in the pod: its own variables win
    env = {**KUBEFLOW_V1, "TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1"}
    info = detect({**env, "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    assert (info.launcher, info.rank, info.node_rank) == ("torchelastic", 3, 1)
