"""Root of the test tree: pytest puts this directory on sys.path, so shared helpers such as
`teardown_abort` import by name from every test directory."""

from __future__ import annotations

import os

import pytest

# What the ranks of this tier import, for the forkserver every CPU rank forks from: the
# trainer and its engines, the tiny GPT-2 presets' modules, and on a machine without GPUs
# DeepSpeed (its import probes for CUDA otherwise, which a forked rank could not then use).
RANK_MODULES = [
    "lockstep.train.trainer",
    "lockstep.checks.harness",
    "lockstep.train.engines.ddp",
    "lockstep.train.engines.fsdp",
    "transformers.models.auto.modeling_auto",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.trainer",  # examples/train_hf_trainer.py
]


@pytest.fixture(scope="session", autouse=True)
def forkserver():
    """Start this pytest process's forkserver once, with everything the tier's ranks import
    (otherwise the first test to need it decides what it preloads, the plugin's pools only
    torch): `lockstep.local_ranks.forkserver_context`."""
    import torch

    from lockstep.local_ranks import forkserver_context

    modules = list(RANK_MODULES)
    saved = dict(os.environ)
    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"  # the server's own environment only
        modules += ["lockstep.train.engines.zero", "deepspeed"]
    try:
        forkserver_context(modules)
    finally:
        os.environ.clear()
        os.environ.update(saved)
