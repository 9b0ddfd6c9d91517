"""Collectives checked by value, all_reduce bus bandwidth, and a GPU matmul checksum.

Each rank checks what it received against a result it can compute alone (a barrier or an
all_reduce of ones proves nothing about the bytes). Bandwidth follows nccl-tests: busbw =
algbw * 2(n-1)/n; the report keeps the slowest rank, since one slow link gates the job.

The rows the ranks gather (section digests, measurements) carry each rank's MAC under the job
key and the run's nonce (`seal_bytes`, `seal_ints`): a row changed on its way, or sent by
something that joined the process group through its unauthenticated rendezvous, is refused
(`open_bytes`, `open_ints`) with the rank it claims.
"""

from __future__ import annotations

import hashlib
import struct
import time

from lockstep.preflight.store import Refused, Signer

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
CPU_SIZES = (256 << 10, 4 << 20)
GPU_SIZES = (8 << 20, 64 << 20, 256 << 20)
_ELEMENTS = 1024
_ITERS = 5
_MATMUL_N = 2048


def verify(dist, torch, device) -> dict[str, bool]:
    """Run each collective on integers small enough to be exact in float32."""
    rank, n = dist.get_rank(), dist.get_world_size()
    base = torch.arange(_ELEMENTS, dtype=torch.float32, device=device)
    ok: dict[str, bool] = {}

    summed = base + rank
    dist.all_reduce(summed)
    ok["all_reduce"] = torch.equal(summed, base * n + n * (n - 1) / 2)

    parts = [torch.empty_like(base) for _ in range(n)]
    dist.all_gather(parts, base + rank * _ELEMENTS)
    ok["all_gather"] = all(torch.equal(p, base + i * _ELEMENTS) for i, p in enumerate(parts))

    src = n - 1  # a non-zero root when n > 1
    sent = base * (src + 1) if rank == src else torch.zeros_like(base)
    dist.broadcast(sent, src)
    ok["broadcast"] = torch.equal(sent, base * (src + 1))

    out = torch.empty_like(base)
    dist.reduce_scatter(out, [base + i + rank for i in range(n)])
    ok["reduce_scatter"] = torch.equal(out, base * n + n * rank + n * (n - 1) / 2)
    return ok


def allreduce_seconds(dist, torch, device, sizes: tuple[int, ...]) -> list[float]:
    """This rank's mean time per all_reduce at each size in bytes."""
    times = []
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections, buffers
        _sync(torch, device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(_ITERS):
            dist.all_reduce(tensor)
        _sync(torch, device)
        times.append((time.perf_counter() - start) / _ITERS)
    return times


def busbw_gbps(size: int, seconds: float, world_size: int) -> float:
    return size / seconds * 2 * (world_size - 1) / world_size / 1e9


def matmul_checksum(torch, device) -> int | None:
    """A 64-bit hash of a fixed fp32 matmul (TF32 off), or None on CPU."""
    if device.type != "cuda":
        return None
    gen = torch.Generator().manual_seed(20240607)
    a = torch.randn(_MATMUL_N, _MATMUL_N, generator=gen).to(device)
    b = torch.randn(_MATMUL_N, _MATMUL_N, generator=gen).to(device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        product = (a @ b).cpu().numpy().tobytes()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return int.from_bytes(hashlib.sha256(product).digest()[:8], "little", signed=True)


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_MAC_BYTES = 32


def seal_bytes(signer: Signer, name: str, rank: int, data: bytes) -> bytes:
    """`data` and this rank's MAC over it, for an all-gather."""
    return bytes(data) + signer.row_mac(name, rank, bytes(data))


def open_bytes(signer: Signer, name: str, rank: int, row: bytes) -> bytes:
    """Rank `rank`'s `data` from its sealed row, or `Refused`."""
    data, mac = row[:-_MAC_BYTES], row[-_MAC_BYTES:]
    if not signer.row_ok(name, rank, data, mac):
        raise Refused(
            "forged",
            f"the {name} row gathered from rank {rank}",
            f"rank {rank}",
            "its MAC does not match the job key",
        )
    return data


def seal_ints(signer: Signer, name: str, rank: int, values: list[int]) -> list[int]:
    """`values` (int64) and this rank's MAC as four more int64s."""
    data = struct.pack(f"<{len(values)}q", *values)
    return [*values, *struct.unpack("<4q", signer.row_mac(name, rank, data))]


def open_ints(signer: Signer, name: str, rank: int, row: list[int]) -> list[int]:
    values = row[:-4]
    open_bytes(signer, name, rank, struct.pack(f"<{len(row)}q", *row))
    return values
