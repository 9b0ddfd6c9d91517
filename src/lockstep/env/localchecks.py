"""Checks one rank can make before meeting its peers (preflight step a).

Each returns {"name", "status" (ok, warn, fail, skip), "detail"}; the details quote the messages
users otherwise meet later (`no socket interface found`, `No space left on device`).
"""

from __future__ import annotations

import os
import socket

from lockstep.env.fingerprint import shm_bytes
from lockstep.env.launcher import RankInfo

SHM_WARN_BYTES = 1 << 30


def _result(name: str, status: str, detail: str) -> dict[str, str]:
    return {"name": name, "status": status, "detail": detail}


def run_all(info: RankInfo, torch) -> list[dict[str, str]]:
    return [
        gpu_assignment(info, torch),
        resolves("master_addr", "MASTER_ADDR", info.master_addr),
        resolves("hostname", "own hostname", socket.gethostname()),
        *socket_ifnames(),
        shm(),
    ]


def device_index(info: RankInfo, torch) -> int | None:
    """The GPU this rank drives: LOCAL_RANK among the visible ones, 0 when narrowed to one."""
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    local = info.local_rank if info.local_rank is not None else info.rank % count
    return local if local < count else None


def gpu_assignment(info: RankInfo, torch) -> dict[str, str]:
    name = "gpu_assignment"
    if not torch.cuda.is_available():
        return _result(name, "skip", "no GPU visible to torch: CPU run on gloo")
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "all GPUs visible"
    entries = [e.strip() for e in visible.split(",")] if visible else []
    if len(set(entries)) != len(entries):
        return _result(name, "fail", f"{shown} lists a GPU twice")
    if count > 1 and info.local_world_size and count < info.local_world_size:
        return _result(
            name,
            "fail",
            f"{info.local_world_size} ranks on this node but {count} GPUs visible ({shown})",
        )
    index = device_index(info, torch)
    if index is None:
        return _result(
            name, "fail", f"LOCAL_RANK={info.local_rank} but only {count} GPUs visible ({shown})"
        )
    return _result(name, "ok", f"cuda:{index} of {count} visible ({shown})")


def resolves(name: str, what: str, host: str) -> dict[str, str]:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as err:
        return _result(
            name, "fail", f"{what} {host!r} does not resolve ({err}); fix /etc/hosts or DNS"
        )
    return _result(name, "ok", f"{what} {host} resolves")


def socket_ifnames() -> list[dict[str, str]]:
    present = [iface for _, iface in socket.if_nameindex()]
    out = []
    nccl = os.environ.get("NCCL_SOCKET_IFNAME")
    if nccl:
        out.append(_nccl_ifname(nccl, present))
    gloo = os.environ.get("GLOO_SOCKET_IFNAME")
    if gloo:
        absent = [i for i in gloo.split(",") if i and i not in present]
        status = "fail" if absent else "ok"
        detail = (
            f"GLOO_SOCKET_IFNAME names {', '.join(absent)}, absent here (have {', '.join(present)})"
            if absent
            else f"GLOO_SOCKET_IFNAME={gloo} exists"
        )
        out.append(_result("gloo_socket_ifname", status, detail))
    return out


def _nccl_ifname(value: str, present: list[str]) -> dict[str, str]:
    """NCCL's syntax: comma list of prefixes, `=` for exact names, `^` to exclude."""
    spec = value
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    wanted = [w for w in spec.removeprefix("=").split(",") if w]

    def matches(iface: str) -> bool:
        return any(iface == w if exact else iface.startswith(w) for w in wanted)

    usable = [i for i in present if matches(i) != exclude]
    if not usable:
        return _result(
            "nccl_socket_ifname",
            "fail",
            f"NCCL_SOCKET_IFNAME={value} matches no interface (have {', '.join(present)}); "
            "NCCL would stop with 'Bootstrap : no socket interface found'",
        )
    return _result("nccl_socket_ifname", "ok", f"NCCL_SOCKET_IFNAME={value} -> {', '.join(usable)}")


def shm() -> dict[str, str]:
    """The one /dev/shm check; the fingerprint records only its size (`resources.shm_gib`)."""
    size = shm_bytes()
    if size is None:
        return _result("shm", "warn", "no /dev/shm: NCCL's shared-memory transport cannot work")
    if size < SHM_WARN_BYTES:
        return _result(
            "shm",
            "warn",
            f"/dev/shm is {size >> 20} MiB (< 1 GiB): NCCL fails with 'No space left on "
            "device'; run the container with --shm-size=16g or --ipc=host",
        )
    return _result("shm", "ok", f"/dev/shm {size / (1 << 30):.1f} GiB")
