"""Launcher recognition: each launcher's variables, half-set and contradictory ones (no torch).

Slurm's, Open MPI's and torchrun's variables come from tables recorded from the real launchers
on a 4-node test bed (tests/env/data/launcher_vars_*.json, `python -m lockstep.cluster.record
tests/env/data`: srun -N4 --ntasks-per-node 2, mpirun -H ls0:2,ls1:2,ls2:2,ls3:2, torchrun
--nnodes 4 --nproc-per-node 2), never written by hand; DeepSpeed's, MVAPICH's and PMI's are.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockstep.cli import main
from lockstep.env.launcher import (
    LAUNCHER_VARIABLES,
    PER_RANK_VARIABLES,
    detect,
    expand_tasks_per_node,
    first_host,
)
from lockstep.errors import UsageError

DATA = Path(__file__).resolve().parent / "data"
MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
CONFIG = str(Path(__file__).resolve().parents[2] / "smoke" / "cpu-ddp.toml")
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RECORDED = {"slurm": "slurm", "openmpi": "openmpi", "torchrun": "torchelastic"}


def recorded(launcher: str) -> dict:
    return json.loads((DATA / f"launcher_vars_{launcher}.json").read_text())


def recorded_rank(launcher: str, rank: int) -> dict[str, str]:
    return dict(recorded(launcher)["ranks"][rank]["env"])


# rank 3 of the real `srun -N4 --ntasks-per-node 2` (on ls1), no MASTER_ADDR/MASTER_PORT
SRUN = recorded_rank("slurm", 3)
# rank 2 of the real `mpirun -H ls0:2,ls1:2,ls2:2,ls3:2 -x MASTER_ADDR -x MASTER_PORT` (on ls1)
MPIRUN = recorded_rank("openmpi", 2)


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


def test_cli_half_set_exits_2_with_one_line(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["preflight"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "WORLD_SIZE" in err and err.startswith("lockstep: error:")


def test_nproc_under_a_launcher_is_a_usage_error(monkeypatch, capsys):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", **MASTER}.items():
        monkeypatch.setenv(key, value)
    assert main(["preflight", "--nproc", "2"]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_slurm_host_list_helpers():
    assert first_host("node1") == "node1"
    assert first_host("a[3-4]") == "a3"
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


@pytest.fixture
def launched(monkeypatch):
    """`launch(env)`: this process as one rank of that launch (every other launcher variable
    unset); the environment, which `train` writes into, is put back afterwards."""
    saved = dict(os.environ)

    def launch(env: dict[str, str]) -> None:
        for name in {*LAUNCHER_VARIABLES, "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"}:
            os.environ.pop(name, None)
        os.environ.update(env)

    yield launch
    os.environ.clear()
    os.environ.update(saved)


def preflight_rendezvous(monkeypatch) -> dict[str, str]:
    """What `lockstep preflight` would connect to under the current launcher."""
    from lockstep.env import preflight

    seen = {}

    def run_rank(info, args):
        seen.update(RANK=info.rank, WORLD_SIZE=info.world_size, LOCAL_RANK=info.local_rank)
        seen.update(MASTER_ADDR=info.master_addr, MASTER_PORT=info.master_port)
        return 0

    monkeypatch.setattr(preflight, "run_rank", run_rank)
    assert main(["preflight"]) == 0
    return {k: str(v) for k, v in seen.items()}


def train_rendezvous(monkeypatch, tmp_path) -> dict[str, str]:
    """The env:// variables `lockstep train` leaves for its process group under the current
    launcher (`init_process_group` reads exactly these)."""
    from lockstep.train import trainer

    seen = {}

    def run_training(cfg, out):
        seen.update({name: os.environ.get(name) for name in RENDEZVOUS})
        return SimpleNamespace(stopped_by=None, summary=lambda: "ok")

    monkeypatch.setattr(trainer, "run_training", run_training)
    assert main(["train", CONFIG, "--out", str(tmp_path)]) == 0
    return seen


def test_preflight_and_train_meet_at_the_same_slurm_rendezvous(launched, monkeypatch, tmp_path):
    launched(SRUN)
    checked = preflight_rendezvous(monkeypatch)
    trained = train_rendezvous(monkeypatch, tmp_path)
    assert trained == checked
    port = str(15000 + int(SRUN["SLURM_JOB_ID"]) % 20000)
    assert checked == dict(
        RANK="3", WORLD_SIZE="8", LOCAL_RANK="1", MASTER_ADDR="ls0", MASTER_PORT=port
    )


def test_train_under_mpirun_takes_ranks_from_open_mpi(launched, monkeypatch, tmp_path):
    launched(MPIRUN)
    trained = train_rendezvous(monkeypatch, tmp_path)
    master = {"MASTER_ADDR": "ls0", "MASTER_PORT": "29500"}  # mpirun -x, as recorded
    assert trained == dict(RANK="2", WORLD_SIZE="8", LOCAL_RANK="0", **master)
    assert trained == preflight_rendezvous(monkeypatch)


def test_train_under_half_set_mpirun_names_the_missing_variable(launched, capsys):
    launched({k: v for k, v in MPIRUN.items() if k != "MASTER_ADDR"})
    assert main(["train", CONFIG]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lockstep: error: openmpi launch needs")
    assert "MASTER_ADDR" in err and "Traceback" not in err


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


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_PROCID": "0"},
        {**SLURM_RANK, "SLURM_NTASKS": "8", "SLURM_STEP_NODELIST": "ls[0-3"},
        {
            **SLURM_RANK,
            "SLURM_NTASKS": "5",
            "SLURM_STEP_NODELIST": "ls[0-3]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
        },
        KUBEFLOW_V1,
    ],
)
def test_cli_bad_cluster_input_exits_2_with_one_line(env, monkeypatch, capsys):
    for name in {*LAUNCHER_VARIABLES, "TORCHELASTIC_RUN_ID", *KUBEFLOW_V1}:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["preflight"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lockstep: error:"), err


def test_kubeflow_trainer_variables_are_the_multinode_flags(monkeypatch):
    from lockstep.env.cli import _multinode

    for name in {*LAUNCHER_VARIABLES, "TORCHELASTIC_RUN_ID", *KUBEFLOW_V1}:
        monkeypatch.delenv(name, raising=False)
    trainer = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "3",
               "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}  # fmt: skip
    for name, value in trainer.items():
        monkeypatch.setenv(name, value)
    args = SimpleNamespace(
        nnodes=None, node_rank=None, nproc_per_node=None, rdzv_endpoint=None, nproc=None
    )
    assert _multinode(args)
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == (4, 3, 2)
    assert args.rdzv_endpoint == "job-node-0-0.job:29400"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--node-rank", "1"], "add --nnodes"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "not below"),
        (["--nnodes", "2", "--node-rank", "0"], "--rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h"], "HOST:PORT"),
        (
            ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--nproc", "2"],
            "--nproc-per-node",
        ),
    ],
)
def test_multinode_flags_misused_exit_2(argv, named, monkeypatch, capsys):
    for name in {*LAUNCHER_VARIABLES, "TORCHELASTIC_RUN_ID", *KUBEFLOW_V1}:
        monkeypatch.delenv(name, raising=False)
    assert main(["preflight", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and named in err, err
