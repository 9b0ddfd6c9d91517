"""torch's CUDA stack (CUDA, cuDNN, NCCL) against a lock's nvidia-* wheels, on this machine's real
torch (the CPU build: no CUDA, no cuDNN, no NCCL) and the repository's real CUDA lock. The
docker tier runs the same comparison inside the CUDA image, where the versions are there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from lockstep.env import cuda_stack, fingerprint
from lockstep.env.lockfile import compare_lock, parse_lock

ROOT = Path(__file__).resolve().parents[2]
CUDA_LOCK = ROOT / "requirements" / "cuda.txt"
CPU_LOCK = ROOT / "requirements" / "cpu.txt"


def test_cudnn_integers_read_as_major_minor_patch():
    assert cuda_stack.cudnn_dotted(92000) == "9.20.0"
    assert cuda_stack.cudnn_dotted(91002) == "9.10.2"
    assert cuda_stack.cudnn_dotted(8907) == "8.9.7"
    assert cuda_stack.cudnn_dotted(None) is None


def test_the_cuda_lock_names_how_a_build_differs_and_a_cpu_lock_compares_nothing():
    pins = parse_lock(CUDA_LOCK)
    locked = {
        "cuda": ".".join(pins["nvidia-cuda-runtime"].split(".")[:2]),
        "cudnn": ".".join(pins["nvidia-cudnn-cu13"].split(".")[:3]),
        "nccl": pins["nvidia-nccl-cu13"],
    }
    same = cuda_stack.compare(dict(locked), pins)
    assert same["matches"] and cuda_stack.differences(same) == []
    assert same["versions"]["nccl"]["pin"] == f"nvidia-nccl-cu13=={pins['nvidia-nccl-cu13']}"
    # The runtime wheel's own patch (13.0.96) is not torch's: CUDA compares major.minor only.
    assert same["versions"]["cuda"]["locked"] == locked["cuda"]

    other = cuda_stack.compare({**locked, "nccl": "2.21.5"}, pins)
    assert not other["matches"]
    assert cuda_stack.differences(other) == [f"NCCL 2.21.5 built, {locked['nccl']} locked"]
    assert cuda_stack.compare(locked, parse_lock(CPU_LOCK)) is None


def test_this_cpu_torch_against_the_cuda_lock_names_all_three(tmp_path):
    section = fingerprint.collect(lock=CUDA_LOCK)["sections"]
    assert section["torch"]["cuda"] is None and section["torch"]["nccl"] is None
    lock = section["packages"]["lock"]
    assert not lock["matches"] and not lock["cuda_stack"]["matches"]
    assert [d.split(" built")[0] for d in cuda_stack.differences(lock["cuda_stack"])] == [
        "CUDA none",
        "cuDNN none",
        "NCCL none",
    ]
    # Against the CPU lock nothing CUDA is compared, and a matching venv still matches.
    installed = section["packages"]["installed"]
    stack = cuda_stack.built(section["torch"])
    assert compare_lock(CPU_LOCK, installed, stack)["cuda_stack"] is None


def test_fingerprint_prints_the_cuda_difference_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "lockstep", "fingerprint", "--lock", str(CUDA_LOCK)],
        capture_output=True,
        text=True,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "packages" in x]
    assert "NCCL none built" in line and "CUDA none built, 13.0 locked" in line


def test_nccl_version_is_none_without_nccl_in_the_build():
    assert cuda_stack.nccl_version(torch) is None  # the CPU build has no NCCL


H200 = ROOT / "tests" / "fixtures" / "h200"


def test_an_h200_machines_own_stack_is_named_first_against_the_cuda_lock():
    """The fingerprint of a lent H200 (its image's torch 2.11, cuDNN 9.19, NCCL 2.28.9; 221
    distributions) against the CUDA image's lock: the stack's differences lead, and torch is
    the first package named among dozens that differ (it was hidden in "31 more")."""
    import json

    from lockstep.env.lockfile import describe

    section = json.loads((H200 / "fingerprint.json").read_text())["sections"]
    stack = cuda_stack.built(section["torch"])
    lock = compare_lock(CUDA_LOCK, section["packages"]["installed"], stack)
    pins = parse_lock(CUDA_LOCK)
    line = describe(lock)
    assert line.startswith(
        f"cuDNN 9.19.0 built, {cuda_stack.cudnn_dotted(92000)} locked; "
        f"NCCL 2.28.9 built, {pins['nvidia-nccl-cu13']} locked; "
    ), line
    # torch first among however many the lock now pins otherwise
    torch_first = (
        rf"\b\d+ different \(torch 2\.11\.0 installed, {re.escape(pins['torch'])} locked, "
    )
    assert re.search(torch_first, line), line
