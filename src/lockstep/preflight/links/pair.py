"""One pair of ranks measuring the link between them: what every link measurement gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pair:
    """This rank's side of a pair. Both ranks run the same measurements in the same order;
    `first`: this rank sends first (the lower rank). Gloo on CPU, NCCL on GPUs (the default
    process group's backend), timed with the stream synchronized.

    Every transfer is a batch (`batch_isend_irecv`), never a single send/recv: on NCCL a single
    one makes the pair a two-rank communicator of its own (N/2 new ones a round), a batch runs
    on the world communicator (created at init, `device_id=`). On gloo a batch is the same
    isend/irecv pair, waited for."""

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
        """A float32 tensor of `n` elements on this rank's device. On CPU filled by numpy, on
        one thread: torch fills a large tensor on its OpenMP threads, and a worker then spins
        for work for milliseconds of CPU, into the first timed transfer; on a loaded machine
        it waited 30-60 ms for a CPU there, summed into the rank's CPU wait (`bandwidth`):
        the first transfer of a pair read as starved half the time, its rank asleep in it."""
        if self.device.type != "cpu":
            return self.torch.full((n,), value, dtype=self.torch.float32, device=self.device)
        import numpy as np

        return self.torch.from_numpy(np.full(n, value, dtype=np.float32))

    def send(self, tensor) -> None:
        self._batch(sends=(tensor,))

    def recv(self, tensor) -> None:
        self._batch(recvs=(tensor,))

    def send_then_recv(self, out, back) -> None:
        """`out` to the peer and its answer into `back`, in one batch: the peer answers only
        once it has `out` (its `recv` then its `send`), so the batch ends after both, in order."""
        self._batch(sends=(out,), recvs=(back,))

    def _batch(self, sends=(), recvs=()) -> None:
        dist = self.dist
        ops = [dist.P2POp(dist.isend, t, self.peer) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.peer) for t in recvs]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
