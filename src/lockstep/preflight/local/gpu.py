"""Which GPU this rank drives, and whether the node's GPUs are shared out right."""

from __future__ import annotations

import os

from lockstep.launch.detect import RankInfo
from lockstep.preflight.local.check import result


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
        return result(name, "skip", "no GPU visible to torch: CPU run on gloo")
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "all GPUs visible"
    entries = [e.strip() for e in visible.split(",")] if visible else []
    if len(set(entries)) != len(entries):
        return result(name, "fail", f"{shown} lists a GPU twice")
    if count > 1 and info.local_world_size and count < info.local_world_size:
        return result(
            name,
            "fail",
            f"{info.local_world_size} ranks on this node but {count} GPUs visible ({shown})",
        )
    index = device_index(info, torch)
    if index is None:
        return result(
            name, "fail", f"LOCAL_RANK={info.local_rank} but only {count} GPUs visible ({shown})"
        )
    return result(name, "ok", f"cuda:{index} of {count} visible ({shown})")
