"""`lockstep preflight` (and `lockstep train`) under each launcher: the rendezvous they meet
at, and the one-line usage errors of bad launcher or multi-node input (no ranks start)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockstep.cli import main
from lockstep.launch.detect import LAUNCHER_VARIABLES
from support.launches import KUBEFLOW_V1, MASTER, MPIRUN, SLURM_RANK, SRUN
from support.preflight_ranks import endpoint_port

CONFIG = str(Path(__file__).resolve().parents[2] / "smoke" / "cpu-ddp.toml")
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


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
    from lockstep.preflight import rank

    seen = {}

    def run_rank(info, args):
        seen.update(RANK=info.rank, WORLD_SIZE=info.world_size, LOCAL_RANK=info.local_rank)
        seen.update(MASTER_ADDR=info.master_addr, MASTER_PORT=info.master_port)
        return 0

    monkeypatch.setattr(rank, "run_rank", run_rank)
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


def test_node_0_whose_check_in_port_is_held_says_what_to_do(monkeypatch, capsys):
    """The endpoint's port + 1 held by a connection's own end (connect() takes those from the
    ephemeral range, as on CI, 2026-11-27): one line naming the port and what to do, exit 2."""
    for name in {*LAUNCHER_VARIABLES, "TORCHELASTIC_RUN_ID", *KUBEFLOW_V1}:
        monkeypatch.delenv(name, raising=False)
    port = endpoint_port()
    argv = ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    with socket.socket() as server, socket.socket() as held:
        server.bind(("127.0.0.1", 0))
        server.listen()
        held.bind(("127.0.0.1", port + 1))
        held.connect(server.getsockname())
        assert main(["preflight", *argv, "--timeout", "5", "--no-links"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Address already in use" in err, err
    assert (
        f"cannot serve the check-in on port {port + 1}, the endpoint's port + 1 (give an "
        "endpoint port whose next one is free, below the ephemeral range" in err
    ), err
