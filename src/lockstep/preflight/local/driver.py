"""Whether this node's NVIDIA driver runs the image's CUDA.

The CUDA image's manifest names the oldest driver its CUDA runtime needs (docker/write-manifest.py);
NVML names the node's driver, and answers even where the driver is too old for torch to see a
GPU (then torch says only `CUDA driver version is insufficient for CUDA runtime version`, or
nothing at all and falls back to the CPU). Outside a CUDA image there is nothing to check.
"""

from __future__ import annotations

from lockstep.env import image_manifest
from lockstep.launch.detect import RankInfo
from lockstep.preflight.local.check import result

NAME = "nvidia_driver"


def driver_version() -> str | None:
    """The node's NVIDIA driver version from NVML; None where no driver answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or no driver: NVML is simply not there
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return version.decode() if isinstance(version, bytes) else str(version)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def judge(driver: str | None, manifest: dict | None) -> dict[str, str] | None:
    """The driver against the manifest's `cuda.min_driver`; None where the image names none."""
    cuda = (manifest or {}).get("cuda") or {}
    need, runtime = cuda.get("min_driver"), cuda.get("runtime", "?")
    if not need:
        return None
    if driver is None:
        return result(
            NAME,
            "skip",
            f"no NVIDIA driver answers (NVML); the image's CUDA {runtime} needs {need}+",
        )
    if _numbers(driver) < _numbers(need):
        return result(
            NAME,
            "fail",
            f"NVIDIA driver {driver} is older than {need}, the oldest that runs the image's CUDA "
            f"{runtime} (`CUDA driver version is insufficient for CUDA runtime version`): "
            "update this node's driver",
        )
    return result(NAME, "ok", f"NVIDIA driver {driver} runs the image's CUDA {runtime} ({need}+)")


def nvidia_driver(info: RankInfo, torch) -> dict[str, str] | None:
    return judge(driver_version(), image_manifest.read())
