"""`lockstep preflight`'s options, declared once with its flags: the Kubeflow Trainer defaults of
the multi-node flags, and the argv the ranks preflight starts itself get back (no ranks start)."""

from __future__ import annotations

import pytest

from lockstep import flags
from lockstep.cli import build_parser
from lockstep.errors import UsageError
from lockstep.preflight.options import MultiNode, Options

TRAINER = {  # what Kubeflow Trainer v2's torch runtime sets in a pod (no torchrun in it)
    "PET_NNODES": "4",
    "PET_NPROC_PER_NODE": "2",
    "PET_NODE_RANK": "3",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29400",
}


def test_kubeflow_trainer_variables_are_the_multinode_flags():
    options = Options().checked(TRAINER)
    assert options.multinode == MultiNode(
        nnodes=4, node_rank=3, nproc_per_node=2, rdzv_endpoint="job-node-0-0.job:29400"
    )
    assert options.multinode.endpoint == ("job-node-0-0.job", 29400)
    # a flag given wins over its variable; torchrun in the pod: the variables are its own
    assert Options(node_rank=1).checked(TRAINER).multinode.node_rank == 1
    assert Options().checked({**TRAINER, "RANK": "0"}).multinode is None
    with pytest.raises(UsageError, match="--nproc-per-node"):
        Options(nproc=2).checked(TRAINER)


def test_options_are_frozen_and_the_nproc_per_node_default_is_one():
    options = Options(nnodes=2, node_rank=0, rdzv_endpoint="h:29500").checked({"PATH": "/bin"})
    assert options.multinode.nproc_per_node == 1 and options.timeout == 60.0
    with pytest.raises(AttributeError):
        options.timeout = 1.0  # type: ignore[misc]


def test_rank_argv_parses_back_to_the_same_options(tmp_path):
    """The ranks preflight starts (`--nproc N`, a node of `--nnodes`) parse `rank_argv()` with
    the same parser, and get the same options, less --nproc and the multi-node flags."""
    lock = tmp_path / "lock.txt"
    lock.write_text("")
    argv = ["preflight", "--nproc", "2", "--timeout", "7.5", "--lock", str(lock)]
    argv += ["--json", str(tmp_path / "r.json"), "--min-busbw", "0.5", "--no-links"]
    argv += ["--min-link-gbps", "2", "--exclude-out", str(tmp_path / "x"), "--plot", "plots"]
    argv += ["--allow", "env.A", "--allow", "env.B*"]
    parser = build_parser()

    def options(args: list[str]) -> Options:
        return flags.read(Options, parser.parse_args(args)).checked({"PATH": "/bin"})

    given = options(argv)
    assert given.nproc == 2 and given.links is False and given.allow == ("env.A", "env.B*")
    again = options(["preflight", *given.rank_argv()])
    assert again == Options(**{**given.__dict__, "nproc": None})
