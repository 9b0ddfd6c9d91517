"""ci/gpu-image.py: gpu.yml decides the GPU image with main's code, the commit's files as data.

The tag it computes is build-args.sh's, byte for byte; a base.lock line that would run a
command when sourced (the old gpu.yml sourced it) is refused without running; the image
reference and its build attestation are checked on `gh attestation verify --format json`
documents in the schema gh documents for it (written here: nothing here can reach GitHub).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "gpu-image.py"
REPO = "Lockstep-Org/lockstep"
DIGEST = "ab" * 32
IMAGE = f"ghcr.io/lockstep-org/lockstep-cuda@sha256:{DIGEST}"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def tree(tmp_path: Path) -> Path:
    for sub in ("docker", "requirements"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    return tmp_path


def build_args_tag(root: Path) -> str:
    out = subprocess.run(
        ["bash", str(root / "docker" / "build-args.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())["CUDA_TAG"]


def test_the_tag_is_build_args_tag_for_the_same_files(tmp_path):
    root = tree(tmp_path)
    assert run("tag", str(root)).stdout == f"CUDA_TAG={build_args_tag(root)}\n"
    (root / "requirements" / "cuda.txt").write_text("torch==0.0\n")
    (root / "docker" / "check-one-nccl.sh").write_text("#!/bin/sh\n")
    moved = build_args_tag(root)
    assert run("tag", str(root)).stdout == f"CUDA_TAG={moved}\n"


def test_the_manifest_the_gpu_job_expects_is_write_manifests_for_the_same_files(tmp_path):
    """gpu.yml's runner check compares these keys with the running image's manifest: they are
    what docker/write-manifest.py writes from the files the tag hashes, for ghcr.io/OWNER."""
    root = tree(tmp_path / "pr")
    result = run("tag", str(root), "--owner", "acme")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert lines["CUDA_TAG"] == build_args_tag(root)
    expected = json.loads(lines["manifest"])
    args = dict(
        line.split("=", 1)
        for line in subprocess.run(
            ["bash", str(root / "docker" / "build-args.sh")],
            capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
        ).stdout.splitlines()
    )  # fmt: skip
    out = tmp_path / "manifest.json"
    subprocess.run(
        [
            sys.executable, str(ROOT / "docker" / "write-manifest.py"),
            f"--image=ghcr.io/acme/lockstep-cuda:{args['CUDA_TAG']}",
            f"--base-image={args['CPU_BASE_IMAGE']}", f"--base-digest={args['CPU_BASE_DIGEST']}",
            f"--lock={root / 'requirements' / 'cuda.txt'}", "--git-revision=x",
            "--build-time=y", f"--out={out}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    written = json.loads(out.read_text())
    assert expected == {key: written[key] for key in expected}
    assert set(expected) == {"image", "base_image", "base_digest", "locks"}
    # Another lock is another manifest; a bad owner is bad input (exit 2), one line.
    (root / "requirements" / "cuda.txt").write_text("torch==0.0\n")
    moved = json.loads(run("tag", str(root), "--owner", "acme").stdout.split("manifest=", 1)[1])
    assert moved["locks"] != expected["locks"] and moved["image"] != expected["image"]
    bad = run("tag", str(root), "--owner", "Not An Owner")
    assert bad.returncode == 2 and bad.stderr.startswith("gpu-image: error: owner")


def test_a_base_lock_that_runs_a_command_when_sourced_is_refused_unrun(tmp_path):
    root = tree(tmp_path)
    planted = tmp_path / "pwned"
    lock = root / "docker" / "base.lock"
    lines = lock.read_text().splitlines()
    lines = [
        f"CPU_BASE_IMAGE=x@sha256:1;touch {planted}" if x.startswith("CPU_BASE") else x
        for x in lines
    ]
    lock.write_text("\n".join(lines) + "\n")
    # the old way: gpu.yml's `source <(docker/build-args.sh)` ran it
    subprocess.run(
        ["bash", "-c", f"set -a; source <({root}/docker/build-args.sh)"],
        capture_output=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert planted.exists(), "the planted command ran when sourced"
    planted.unlink()
    result = run("tag", str(root))
    assert result.returncode == 1 and not planted.exists()
    assert "base.lock:" in result.stderr and "CPU_BASE_IMAGE=x@sha256:1;touch" in result.stderr
    assert len(result.stderr.splitlines()) == 1


# Every file the image job reads from the commit (gpu-image.py's IMAGE_FILES, the lock, base.lock).
READ_FROM_THE_COMMIT = [
    "docker/base.lock",
    "requirements/cuda.txt",
    "docker/Dockerfile",
    "docker/install-lock.sh",
    "docker/write-manifest.py",
    "docker/check-one-nccl.sh",
    "docker/lock-parts.py",
    "docker/deepspeed-build.env",
]


def run_bounded(*args: str) -> subprocess.CompletedProcess:
    """run(), but a hang fails the test instead of the run (today's reader blocked on a FIFO)."""
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize("name", READ_FROM_THE_COMMIT)
def test_a_file_of_the_commit_that_is_a_symlink_is_refused_unread(tmp_path, name):
    root = tree(tmp_path / "pr")
    secret = tmp_path / "host-file"
    secret.write_text("CPU_BASE_IMAGE=host-secret-" + "s" * 80 + "\n")
    (root / name).unlink()
    (root / name).symlink_to(secret)
    result = run_bounded("tag", str(root))
    assert result.returncode == 1, result.stdout
    assert (
        result.stderr
        == f"gpu-image: refused: {root / name}: a symbolic link, read only as a regular file\n"
    )
    assert "host-secret" not in result.stderr + result.stdout


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "folder"])
def test_a_file_that_would_hang_or_is_not_a_file_is_refused_at_once(tmp_path, target):
    root = tree(tmp_path / "pr")
    lock = root / "requirements" / "cuda.txt"
    lock.unlink()
    if target == "fifo":
        os.mkfifo(lock)  # git cannot check one out, but nothing else may block the job either
    elif target == "folder":
        lock.mkdir()
    else:
        lock.symlink_to(target)
    result = run_bounded("tag", str(root))
    assert result.returncode == 1 and result.stderr.startswith(f"gpu-image: refused: {lock}: ")
    assert len(result.stderr.splitlines()) == 1


def test_a_folder_on_the_way_that_is_a_symlink_is_refused(tmp_path):
    root = tree(tmp_path / "pr")
    shutil.move(root / "docker", tmp_path / "elsewhere")
    (root / "docker").symlink_to(tmp_path / "elsewhere")
    result = run_bounded("tag", str(root))
    assert result.returncode == 1
    assert (
        result.stderr
        == f"gpu-image: refused: {root / 'docker'}: a symbolic link, read only as a regular file\n"
    )


def test_a_file_over_the_bound_is_refused_unread(tmp_path):
    root = tree(tmp_path / "pr")
    with (root / "requirements" / "cuda.txt").open("r+b") as lock:
        lock.truncate((1 << 20) + 1)  # sparse: no MiB written
    result = run_bounded("tag", str(root))
    assert result.returncode == 1
    assert "requirements/cuda.txt: 1048577 bytes, over the 1048576 read" in result.stderr


@pytest.mark.parametrize(
    "line",
    [
        'CPU_BASE_IMAGE="debian:1@sha256:' + "0" * 64 + '"',
        "export CPU_BASE_IMAGE=debian:1@sha256:" + "0" * 64,
        "PATH=/tmp@sha256:" + "0" * 64,
        "CPU_BASE_IMAGE=$(id)@sha256:" + "0" * 64,
        "CPU_BASE_IMAGE=debian:1@sha256:" + "1" * 64,  # a second CPU line
        # the nvidia/cuda base is gone: both images start from CPU_BASE_IMAGE
        "CUDA_BASE_IMAGE=nvidia/cuda:1@sha256:" + "0" * 64,
    ],
)
def test_the_reader_takes_nothing_but_known_pinned_keys(tmp_path, line):
    root = tree(tmp_path)
    lock = root / "docker" / "base.lock"
    lock.write_text(lock.read_text() + line + "\n")
    result = run("tag", str(root))
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("gpu-image: refused: ")


def attestation(**change) -> list[dict]:
    cert = {
        "issuer": "https://token.actions.githubusercontent.com",
        "subjectAlternativeName": f"https://github.com/{REPO}/.github/workflows/images.yml@refs/heads/main",
        "buildSignerURI": f"https://github.com/{REPO}/.github/workflows/images.yml@refs/heads/main",
        "sourceRepositoryURI": f"https://github.com/{REPO}",
        "sourceRepositoryRef": "refs/heads/main",
        "runnerEnvironment": "github-hosted",
        "githubWorkflowTrigger": "push",
    }
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "predicateType": "https://slsa.dev/provenance/v1",
        "subject": [{"name": IMAGE.split("@")[0], "digest": {"sha256": DIGEST}}],
    }
    for key, value in change.items():
        (statement if key in statement else cert)[key] = value
    return [
        {
            "attestation": {
                "bundle": {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}
            },
            "verificationResult": {
                "signature": {"certificate": cert},
                "statement": statement,
                "verifiedTimestamps": [{"type": "Tlog", "timestamp": "2026-11-20T10:00:00Z"}],
            },
        }
    ]


def verify(tmp_path: Path, document: object, image: str = IMAGE) -> subprocess.CompletedProcess:
    file = tmp_path / "attestation.json"
    file.write_text(json.dumps(document))
    return run("verify", "--image", image, "--repo", REPO, "--attestation", str(file))


def test_an_image_built_by_images_yml_on_main_is_taken(tmp_path):
    result = verify(tmp_path, attestation())
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"image={IMAGE}\n"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            {
                "buildSignerURI": f"https://github.com/{REPO}/.github/workflows/evil.yml@refs/heads/main"
            },
            "buildSignerURI",
        ),
        ({"sourceRepositoryRef": "refs/heads/pr-branch"}, "sourceRepositoryRef"),
        ({"sourceRepositoryURI": "https://github.com/fork/lockstep"}, "sourceRepositoryURI"),
        ({"runnerEnvironment": "self-hosted"}, "runnerEnvironment"),
        (
            {"subject": [{"name": IMAGE.split("@")[0], "digest": {"sha256": "cd" * 32}}]},
            "no subject",
        ),
        ({"predicateType": "https://spdx.dev/Document/v2.3"}, "predicate"),
    ],
)
def test_an_image_not_vouched_for_by_main_is_refused(tmp_path, change, why):
    result = verify(tmp_path, attestation(**change))
    assert result.returncode == 1 and why in result.stderr, result.stderr


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/lockstep-org/lockstep-cuda:env-0123456789abcdef",
        f"ghcr.io/someone-else/lockstep-cuda@sha256:{DIGEST}",
        f"docker.io/lockstep-org/lockstep-cuda@sha256:{DIGEST}",
        f"ghcr.io/lockstep-org/lockstep-cuda@sha256:{DIGEST};id",
        f"ghcr.io/lockstep-org/lockstep-cpu@sha256:{DIGEST}",
    ],
)
def test_a_reference_of_another_shape_is_refused(tmp_path, image):
    result = verify(tmp_path, attestation(), image=image)
    assert (
        result.returncode == 1
        and "is not ghcr.io/lockstep-org/lockstep-cuda@sha256:" in result.stderr
    )


def test_no_attestation_and_bad_json(tmp_path):
    assert verify(tmp_path, []).returncode == 1
    (tmp_path / "bad.json").write_text("{not json")
    result = run(
        "verify", "--image", IMAGE, "--repo", REPO, "--attestation", str(tmp_path / "bad.json")
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
