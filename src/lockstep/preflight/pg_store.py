"""The process group's own store, apart from lockstep's (issue 38).

torch's process group rendezvous through a store: gloo posts one key a rank, NCCL's scalable
init about N^2/128. On lockstep's store that traffic would share one server with the
protocol's keys (check-in, verdict, heartbeat), so at 64k ranks a waiter's read queues behind
the process group's. So rank 0 always serves a second TCPStore (libuv) for the process group
alone, on a port the kernel picks on MASTER_ADDR's address (`store.listen`), and tells the
others its port in the check-in's answer: signed, echoing every poster's challenge, read by
every rank anyway, so a forged or replayed port is refused with the rest of the answer.

One design for every launcher: lockstep's protocol stays on the store at MASTER_ADDR:MASTER_PORT
(rank 0's under srun, mpirun, PMI, deepspeed and Kubernetes env; torchrun's agent's under
torchrun, which also carries its own few rendezvous keys), and the process group goes to rank
0's second store in every case. Moving lockstep's keys off torchrun's agent store instead would
need a second path for torchrun alone and would leave srun's rank 0 serving both anyway. The
picked port needs what NCCL's own bootstrap needs already: the other nodes reach rank 0's host
on an ephemeral port.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from lockstep.errors import RankTimeout, UsageError
from lockstep.preflight.lines import first_line
from lockstep.preflight.store import listen

PREFIX = "pg"  # the process group's keys, under this prefix of its own store


def serve(host: str, timeout_s: float):
    """Rank 0: (the server, its port), listening on HOST's address on a port picked here."""
    import torch.distributed as dist

    try:
        fd, address = listen(host, 0)
    except OSError as err:
        raise UsageError(f"rank 0 cannot serve the process group's store: {err}") from None
    with socket.socket(fileno=os.dup(fd)) as sock:
        port = sock.getsockname()[1]
    try:
        raw = dist.TCPStore(
            address,
            port,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=fd,
            use_libuv=True,
        )
    except (RuntimeError, OSError) as err:
        os.close(fd)
        raise UsageError(
            f"rank 0 cannot serve the process group's store: {first_line(err)}"
        ) from None
    return raw, port


def join(host: str, port: int, timeout_s: float):
    """The others: a client of rank 0's process-group store (its port from the check-in)."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=timeout_s), use_libuv=True
        )
    except (RuntimeError, OSError) as err:
        raise RankTimeout(
            f"rank 0's process-group store at {host}:{port} did not answer: {first_line(err)}"
        ) from None


def for_group(raw):
    """What `init_process_group(store=...)` gets."""
    import torch.distributed as dist

    return dist.PrefixStore(PREFIX, raw)


def is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
