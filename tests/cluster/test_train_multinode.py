"""`lockstep train` across real node boundaries: 4 nodes x 2 ranks under srun and under torchrun
end with the parameter digest, bitwise, of 8 ranks on one host on the same global batch, and
within the world-size check's tolerance of 1 rank. The elastic runs, compared bitwise with an
uninterrupted 4-node torchrun run of the same job (equal to this module's, hence to 8 ranks on
one host): test_elastic_multinode.py, a module of its own so that pytest-xdist runs it beside
this one. The job and its comparisons: tests/support/multinode_train.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from lockstep.checks.harness import numeric_tolerance
from lockstep.train.config import load_config
from lockstep_testbed.launch import start_torchrun
from support.multinode_train import (
    CONFIG,
    METRICS,
    OVERRIDES,
    STEPS,
    TIMEOUT,
    Run,
    assert_bitwise,
    check_ok,
    train_argv,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def bed(cluster):
    yield cluster


@pytest.fixture(scope="module")
def one_host(bed) -> dict[int, Run]:
    """`lockstep train --nproc 8` and `--nproc 1` on node 0: the references."""
    runs = {}
    for nproc in (8, 1):
        name = f"host-{nproc}"
        argv = [bed.python, *train_argv(bed, name), "--nproc", str(nproc)]
        result = bed.run(0, argv, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-2500:]
        runs[nproc] = Run(bed, name, [result.stdout])
    return runs


def assert_within_tolerance(run: Run, ref: Run) -> None:
    """The world-size check's comparison: loss, grad norm and lr per step within
    `numeric_tolerance`, final parameters within 1% of the learning rate (absolute)."""
    cfg = load_config(CONFIG, [f"{k}={v}" for k, v in OVERRIDES.items()])
    rtol, atol = numeric_tolerance(cfg)
    for s in range(1, STEPS + 1):
        for m in METRICS:
            a, b = run.rows[s][m], ref.rows[s][m]
            assert abs(a - b) <= atol + rtol * abs(b), (
                f"step {s} {m}: {run.name} {a}, {ref.name} {b}"
            )
    param_atol = 1e-2 * cfg.optimizer.lr
    worst = max((run.params[n] - ref.params[n]).abs().max().item() for n in ref.params)
    print(
        f"{run.name} vs {ref.name}: digests {run.digest} / {ref.digest}, max |dparam| {worst:.3g}"
    )
    for n, want in ref.params.items():
        assert torch.allclose(run.params[n], want, rtol=rtol, atol=param_atol), n


def test_one_rank_is_within_the_world_size_tolerance_of_eight(one_host):
    assert_within_tolerance(one_host[1], one_host[8])


def test_train_under_srun_on_four_nodes_equals_eight_ranks_on_one_host(bed, slurm, one_host):
    """This run had another digest before `lockstep train` gave srun's ranks their share of
    the node's cores: torch's default (every core per rank) changes CPU float sums."""
    result = slurm.srun([bed.python, *train_argv(bed, "srun")], ntasks_per_node=2, timeout=TIMEOUT)
    outputs = check_ok({"srun": result}, "srun -N4 --ntasks-per-node=2 lockstep train")
    run = Run(bed, "srun", outputs)
    assert json.loads((run.out / "run_config.json").read_text())["world_size"] == 8
    assert_bitwise(run, one_host[8])


def test_train_under_torchrun_on_four_nodes_equals_eight_ranks_on_one_host(bed, one_host):
    procs = start_torchrun(bed, train_argv(bed, "torchrun"), nproc_per_node=2)
    outputs = check_ok(bed.wait_all(procs, TIMEOUT), "torchrun on 4 nodes")
    assert_bitwise(Run(bed, "torchrun", outputs), one_host[8])
