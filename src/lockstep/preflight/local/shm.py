"""/dev/shm large enough for NCCL's shared-memory transport (`lockstep.env.shm`, which
`lockstep fingerprint` prints too)."""

from __future__ import annotations

from lockstep.env import shm as env_shm
from lockstep.launch.detect import RankInfo


def shm(info: RankInfo, torch) -> dict[str, str]:
    return env_shm.check()
