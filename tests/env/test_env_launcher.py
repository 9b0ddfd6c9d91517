"""Launcher recognition: each launcher's variables, half-set and contradictory ones (no torch)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockstep.cli import main
from lockstep.env.launcher import LAUNCHER_VARIABLES, detect, expand_tasks_per_node, first_host
from lockstep.errors import UsageError

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
CONFIG = str(Path(__file__).resolve().parents[2] / "smoke" / "cpu-ddp.toml")
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SRUN = {  # rank 3 of `srun -N2 --ntasks-per-node 2`, no MASTER_ADDR/MASTER_PORT exported
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "4242",
    "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9",  # the old train-only derivation's address
}
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    **MASTER,
}


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
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "OMPI_COMM_WORLD_NODE_RANK": "1",
                "SLURM_PROCID": "0",  # mpirun inside an allocation: Open MPI's numbers win
                **MASTER,
            },
            "openmpi",
            2,
            4,
            0,
            2,
            1,
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
        (
            {
                "SLURM_PROCID": "3",
                "SLURM_NTASKS": "4",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                **MASTER,
            },
            "slurm",
            3,
            4,
            1,
            2,
            1,
        ),
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
    port = str(15000 + 4242 % 20000)
    assert checked == dict(
        RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="gpu07", MASTER_PORT=port
    )


def test_train_under_mpirun_takes_ranks_from_open_mpi(launched, monkeypatch, tmp_path):
    launched(MPIRUN)
    trained = train_rendezvous(monkeypatch, tmp_path)
    assert trained == dict(RANK="2", WORLD_SIZE="4", LOCAL_RANK="0", **MASTER)
    assert trained == preflight_rendezvous(monkeypatch)


def test_train_under_half_set_mpirun_names_the_missing_variable(launched, capsys):
    launched({k: v for k, v in MPIRUN.items() if k != "MASTER_ADDR"})
    assert main(["train", CONFIG]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lockstep: error: openmpi launch needs")
    assert "MASTER_ADDR" in err and "Traceback" not in err
