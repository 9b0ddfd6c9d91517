"""Deterministic training data, sharded by rank, with a position that checkpoints can hold:
step `s` trains on global samples [s*G, (s+1)*G) at any world size. Design: docs/design/train.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lockstep.train.config import DataConfig, resolve_factory


def synthetic_sample(seed: int, index: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    start = int(torch.randint(vocab_size, (1,), generator=gen))
    stride = int(torch.randint(1, 8, (1,), generator=gen))
    return (start + stride * torch.arange(seq_len)) % vocab_size


@dataclass
class ShardedStream:
    """Micro batches for one rank; `position` (optimizer steps consumed) is all a resume needs."""

    sample: Callable[[int], torch.Tensor]
    rank: int
    world_size: int
    micro_size: int
    grad_accum: int
    position: int = 0

    @property
    def global_size(self) -> int:
        return self.micro_size * self.world_size * self.grad_accum

    def micro_batches(self) -> list[torch.Tensor]:
        """The `grad_accum` micro batches of this rank for the next optimizer step."""
        base = self.position * self.global_size
        batches = []
        for micro in range(self.grad_accum):
            first = base + (micro * self.world_size + self.rank) * self.micro_size
            batches.append(torch.stack([self.sample(first + j) for j in range(self.micro_size)]))
        self.position += 1
        return batches

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "global_size": self.global_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def build_stream(
    cfg: DataConfig, seed: int, vocab_size: int, rank: int, world_size: int, micro: int, accum: int
) -> ShardedStream:
    if cfg.factory:
        dataset: Sequence[torch.Tensor] = resolve_factory(cfg.factory, "data.factory")(
            cfg.seq_len, vocab_size
        )

        def sample(i: int) -> torch.Tensor:
            return torch.as_tensor(dataset[i % len(dataset)], dtype=torch.long)
    else:

        def sample(i: int) -> torch.Tensor:
            return synthetic_sample(seed, i, cfg.seq_len, vocab_size)

    return ShardedStream(sample, rank, world_size, micro, accum)
