"""What a rank tells the others at the preflight's check-in: who and where it is, its GPU, its
local checks (the verdict names hosts and addresses from these)."""

from __future__ import annotations

import socket

import torch

from lockstep.launch.detect import RankInfo


def identity_of(info: RankInfo, device: torch.device, checks: list[dict]) -> dict:
    """What this rank tells the others at the check-in: who and where it is, its GPU, its
    local checks."""
    gpu_info = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu_info = {
            "index": device.index,
            "name": props.name,
            "uuid": str(getattr(props, "uuid", "")).removeprefix("GPU-") or None,
        }
    return {
        "rank": info.rank,
        "host": socket.gethostname(),
        "address": address(info),
        "node": info.node_rank,
        "local_rank": info.local_rank,
        "launcher": info.launcher,
        "world_size": info.world_size,
        "gpu": gpu_info,
        "checks": checks,
    }


def address(info: RankInfo) -> str | None:
    """This host's address toward MASTER_ADDR (the source address the route picks; a UDP
    connect sends nothing), None where it does not resolve or route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((info.master_addr, info.master_port))
            return sock.getsockname()[0]
    except OSError:
        return None
