"""lockstep: reproducibility and CI for distributed PyTorch, FSDP and DeepSpeed training."""

__version__ = "0.1.0"
