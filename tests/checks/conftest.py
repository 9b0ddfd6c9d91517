"""DeepSpeed on CPU for every rank of the CPU/gloo tier.

Tier markers (registered in pyproject.toml): `smoke` (one GPU, `nox -s smoke`) and
`multi_gpu` (every local GPU, `nox -s multi_gpu`); tests without one are the CPU/gloo tier.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def deepspeed_on_cpu(monkeypatch):
    """Every rank of a distributed test sees the pytest process's environment; on a machine
    without GPUs DeepSpeed must use its CPU accelerator (on GPUs it picks CUDA by itself)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")
