"""A planted hang in lockstep's reference job, through its own extension point (`data.factory`,
a user's dataset): `--set data.factory=support.planted_job:dataset` with
`PLANT_STUCK=RANK:STEP` in the launch's environment makes rank RANK's dataset block in Python
(an NFS read that never returns) when it fetches the first sample of optimizer step STEP (1 is
the first), while the other ranks go on into that step's collectives and wait there.

Ranks forked from the test process's forkserver import it from tests/ (the server has pytest's
sys.path); the samples are the synthetic stream's (`lockstep.train.data.synthetic_sample`).
"""

from __future__ import annotations

import os
import time

ENV = "PLANT_STUCK"


class _Stuck:
    def __init__(self, seq_len: int, vocab_size: int):
        self.seq_len, self.vocab_size = seq_len, vocab_size
        rank, step = os.environ.get(ENV, "-1:0").split(":")
        self.stuck = os.environ.get("RANK") == rank
        self.step = int(step)
        self.seen = 0

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        from lockstep.train.data import synthetic_sample

        self.seen += 1
        if self.stuck and self.seen > self._per_step() * (self.step - 1):
            while True:  # blocked in Python, no collective pending
                time.sleep(3600)
        return synthetic_sample(0, index, self.seq_len, self.vocab_size)

    def _per_step(self) -> int:
        """Samples this rank fetches a step: PLANT_SAMPLES (micro_size x grad_accum)."""
        return int(os.environ.get("PLANT_SAMPLES", "8"))


def dataset(seq_len: int, vocab_size: int) -> _Stuck:
    return _Stuck(seq_len, vocab_size)
