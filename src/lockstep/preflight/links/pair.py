"""One pair of ranks measuring the link between them: what every link measurement gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pair:
    """This rank's side of a pair. Both ranks run the same measurements in the same order;
    `first`: this rank sends first (the lower rank). torch.distributed send/recv: gloo on CPU,
    NCCL on GPUs (the default process group's backend), timed with the stream synchronized."""

    dist: Any
    torch: Any
    device: Any
    peer: int
    first: bool
    nbytes: int  # what a bandwidth transfer moves

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def floats(self, n: int, value: float = 0.0):
        """A float32 tensor of `n` elements on this rank's device."""
        return self.torch.full((n,), value, dtype=self.torch.float32, device=self.device)
