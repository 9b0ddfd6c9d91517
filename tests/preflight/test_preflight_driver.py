"""preflight's NVIDIA driver check against the CUDA image's manifest (docker/write-manifest.py's,
written for real from requirements/cuda.txt). This machine has no driver: the comparison itself
is run with the driver versions a GPU node's NVML would report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.env import image_manifest
from lockstep.launch.detect import RankInfo
from lockstep.preflight.local import driver, registry

ROOT = Path(__file__).resolve().parents[2]


def manifest(tmp_path: Path, variant: str) -> Path:
    out = tmp_path / f"{variant}-manifest.json"
    digest = "sha256:" + "0" * 64
    subprocess.run(
        [
            sys.executable, str(ROOT / "docker" / "write-manifest.py"), f"--image=lockstep-{variant}:x",
            f"--base-image=debian:bookworm-slim@{digest}", f"--base-digest={digest}",
            f"--lock={ROOT / 'requirements' / f'{variant}.txt'}", "--git-revision=r",
            "--build-time=t", f"--out={out}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


@pytest.mark.parametrize(
    "version, status",
    [("575.57.08", "fail"), ("580.65.05", "fail"), ("580.65.06", "ok"), ("590.44.01", "ok")],
)
def test_a_driver_below_the_images_minimum_fails_in_one_line(tmp_path, version, status):
    cuda = image_manifest.read(manifest(tmp_path, "cuda"))
    found = driver.judge(version, cuda)
    assert found["status"] == status and "\n" not in found["detail"]
    if status == "fail":
        assert found["detail"].startswith(f"NVIDIA driver {version} is older than 580.65.06")
        assert f"CUDA {cuda['cuda']['runtime']}" in found["detail"]


def test_where_it_applies_and_where_not(tmp_path, monkeypatch):
    info = RankInfo.__new__(RankInfo)
    assert registry.LOCAL_CHECKS[driver.NAME].blocks == ("nccl",)
    # The CPU image names no minimum driver: no row.
    monkeypatch.setenv("LOCKSTEP_IMAGE_MANIFEST", str(manifest(tmp_path, "cpu")))
    assert driver.nvidia_driver(info, None) is None
    # The CUDA image on a machine with no driver (this one): a skip saying what it needs.
    monkeypatch.setenv("LOCKSTEP_IMAGE_MANIFEST", str(manifest(tmp_path, "cuda")))
    assert driver.driver_version() is None
    found = driver.nvidia_driver(info, None)
    assert found["status"] == "skip" and "needs 580.65.06+" in found["detail"]
    # Outside any image: no row.
    monkeypatch.setenv("LOCKSTEP_IMAGE_MANIFEST", str(tmp_path / "absent.json"))
    assert driver.nvidia_driver(info, None) is None
