"""A data factory for planting a known slowdown in a gate run (`data.factory`).

The reference job's synthetic stream, but every `PLANTED_EVERY`-th sample waits
`PLANTED_WAIT_S` seconds first (0 by default: the unchanged job). Record the golden with the
factory and no wait, then check with a wait of a tenth of the golden's step time once per step:
the config is the same, only the step is slower, as a slower input pipeline would make it.
`PLANTED_SPIN=1` busy-waits instead of sleeping: CPU work, as decoding or tokenizing is, which
keeps the core out of its idle states.
"""

from __future__ import annotations

import os
import time

from lockstep.train.data import synthetic_sample


class WaitingStream:
    def __init__(self, seq_len: int, vocab_size: int, wait_s: float, every: int, spin: bool):
        self.seq_len, self.vocab, self.wait_s, self.every = seq_len, vocab_size, wait_s, every
        self.spin = spin

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):
        if self.wait_s > 0 and i % self.every == 0:
            if self.spin:
                end = time.perf_counter() + self.wait_s
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(self.wait_s)
        return synthetic_sample(1234, i, self.seq_len, self.vocab)


def planted(seq_len: int, vocab_size: int) -> WaitingStream:
    wait_s = float(os.environ.get("PLANTED_WAIT_S", "0"))
    every = int(os.environ.get("PLANTED_EVERY", "1"))
    spin = os.environ.get("PLANTED_SPIN", "0") == "1"
    return WaitingStream(seq_len, vocab_size, wait_s, every, spin)
