"""Root of the test tree: pytest puts this directory on sys.path, so the shared helpers under
support/ import as `support.NAME` from every test directory."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def forkserver():
    """Start this pytest process's forkserver once, with everything the tier's ranks import
    (otherwise the first test to need it decides what it preloads, the plugin's pools only
    torch): `lockstep.launch.forkserver_context`. The modules are the trainer's, every
    engine's (DeepSpeed only on a machine without GPUs: its import probes for CUDA otherwise,
    which a forked rank could not then use), the default preset's and transformers' Trainer
    (examples/train_hf_trainer.py)."""
    import torch

    from lockstep.launch import forkserver_context
    from lockstep.train.config import ModelConfig
    from lockstep.train.engines import ENGINES, engine_modules
    from lockstep.train.model import model_modules

    gpu = torch.cuda.is_available()
    engines = [e for e, spec in ENGINES.items() if not (gpu and "deepspeed" in spec.requires)]
    modules = ["lockstep.train.trainer", "lockstep.checks.harness", "transformers.trainer"]
    modules += [m for e in engines for m in engine_modules(e)] + model_modules(ModelConfig())
    saved = dict(os.environ)
    if not gpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # the server's own environment only
    try:
        forkserver_context(list(dict.fromkeys(modules)))
    finally:
        os.environ.clear()
        os.environ.update(saved)


# Modules holding the CPU tier's longest single tests (15-37 s each, docs/benchmarks.md), and
# those of several 5-10 s tests that collection order puts last, first: pytest-xdist deals
# tests out in collection order, and what is dealt last runs on one worker while the others
# sit idle.
LONGEST_FIRST = (
    "test_planted_secrets.py",
    "test_gate_reference.py",
    "test_resume_eight_ranks.py",
    "test_train_engines.py",
    "test_distributed_marker.py",
    "test_leftovers.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest in order
