"""Elastic across nodes: under torchrun with one restart allowed, `lockstep train` on 4 nodes x
2 ranks survives one node's workers killed mid-run, and a whole node lost and replaced
(`--nnodes 3:4`), resuming from its checkpoint on the shared folder and ending bitwise equal to
the uninterrupted run: the same job under torchrun on the same 4 nodes, which
test_train_multinode.py holds bitwise equal to 8 ranks on one host (the elastic check, made
multi-node). Its own module (and bed) so that pytest-xdist runs it beside that one.
"""

from __future__ import annotations

import json
import time

import pytest

from lockstep_testbed.launch import kill_workers, start_torchrun
from support.multinode_train import (
    KILL_AFTER,
    TIMEOUT,
    Run,
    assert_resumed_and_equal,
    check_ok,
    latest_step,
    train_argv,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def bed(cluster):
    yield cluster


@pytest.fixture(scope="module")
def uninterrupted(bed) -> Run:
    """The job under torchrun on the 4 nodes, no fault: the reference of both elastic runs."""
    procs = start_torchrun(bed, train_argv(bed, "uninterrupted"), nproc_per_node=2)
    return Run(bed, "uninterrupted", check_ok(bed.wait_all(procs, TIMEOUT), "torchrun on 4 nodes"))


def test_torchrun_restarts_when_one_nodes_workers_are_killed(bed, uninterrupted):
    """Node 2's two workers SIGKILLed mid-run (not its agent): with --max-restarts 1 every
    agent restarts its workers, the job resumes from the latest checkpoint on the shared folder
    and ends equal to the uninterrupted run."""
    name = "elastic-workers"
    agents = start_torchrun(
        bed, train_argv(bed, name), nproc_per_node=2, extra=["--max-restarts", "1"]
    )
    wait_for_checkpoint(bed.shared / name / "checkpoints", KILL_AFTER, agents)
    killed_at = time.time()
    killed = kill_workers(agents[2])
    resume_from = latest_step(bed.shared / name / "checkpoints")  # no checkpoint completes now
    outputs = check_ok(bed.wait_all(agents, TIMEOUT), f"torchrun after killing ls2's {killed}")
    assert_resumed_and_equal(Run(bed, name, outputs), uninterrupted, killed_at, resume_from)


def test_torchrun_resumes_when_a_node_is_lost_and_replaced(bed, uninterrupted):
    """Node 3's agent and workers killed mid-run (the node is lost); a new agent starts on it
    (the replacement) and joins the next rendezvous round before `--nnodes 3:4` would close it
    with three nodes (last call: 60 s), so the world stays 8 ranks. Node 0 is not the one lost: its agent serves the c10d store.

    The agents run with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: with torch's default (the
    rendezvous TCPStore shared with the workers) an agent publishes MASTER_ADDR/MASTER_PORT
    only in the first round it joins, so a replacement agent that joins round 1 waits on
    `torch.rendezvous.<id>.1/MASTER_ADDR` for ever and the round-0 agents on its role info
    (`assigned_ranks`): torch 2.13's agent cannot take in a new node under store sharing."""
    name = "elastic-node"
    extra = ["--max-restarts", "1", "--rdzv-conf", "last_call_timeout=60"]
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = start_torchrun(
        bed, train_argv(bed, name), nnodes="3:4", nproc_per_node=2, env=env, extra=extra
    )
    wait_for_checkpoint(bed.shared / name / "checkpoints", KILL_AFTER, agents)
    lost = agents.pop(3)
    killed_at = time.time()
    lost.kill_tree()
    lost.wait(timeout=10)
    resume_from = latest_step(bed.shared / name / "checkpoints")
    (replacement,) = start_torchrun(
        bed,
        train_argv(bed, name),
        nodes=[3],
        nnodes="3:4",
        nproc_per_node=2,
        env=env,
        extra=extra,
    ).values()
    agents[3] = replacement
    outputs = check_ok(bed.wait_all(agents, TIMEOUT), "torchrun after replacing ls3")
    run = Run(bed, name, outputs)
    assert json.loads((run.out / "run_config.json").read_text())["world_size"] == 8
    assert_resumed_and_equal(run, uninterrupted, killed_at, resume_from)
