"""ci/docker-tier.py, the Python steps of the docker tier, run for real without an engine.

Inputs are real: data/bake-print.json is what `docker buildx bake --print cpu cuda` (buildx
0.13.1, Debian's, the tier's) printed for docker/docker-bake.hcl with build-args.sh's variables;
the manifest is written by docker/write-manifest.py; the labels are the Dockerfile's own LABEL
instruction with the build arguments filled in, as `docker image inspect` gives them.
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_image_policy import stages

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "docker-tier.py"
BAKE = Path(__file__).parent / "data" / "bake-print.json"
LOCK = ROOT / "requirements" / "cpu.txt"


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=ROOT,
    )


def failed(result: subprocess.CompletedProcess, why: str) -> bool:
    lines = result.stderr.strip().splitlines()
    return (
        result.returncode == 1
        and len(lines) == 1
        and lines[0].startswith("docker-tier: error:")
        and why in lines[0]
    )


def test_port_free_binds_for_real():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert run("port-free", str(port)).returncode == 1
    assert run("port-free", str(port)).returncode == 0


def test_wait_http_waits_for_a_server_and_gives_up_on_none(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    # Nothing listens: it gives up after the deadline, naming the URL.
    start = time.monotonic()
    result = run("wait-http", url, "1")
    assert failed(result, f"{url} did not answer") and time.monotonic() - start >= 1

    # A server that starts after the wait has begun (as the tier's registry does).
    handler = http.server.SimpleHTTPRequestHandler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    starter = threading.Timer(1.0, server.serve_forever)
    waiting = subprocess.Popen(
        [sys.executable, "-I", str(SCRIPT), "wait-http", url, "20"], cwd=tmp_path
    )
    starter.start()
    try:
        assert waiting.wait(timeout=30) == 0
    finally:
        server.shutdown()
        server.server_close()
        starter.join()


def bake_args(printed: dict, **change: str) -> list[str]:
    cpu, cuda = printed["target"]["cpu"], printed["target"]["cuda"]
    args = {
        "--image": cpu["tags"][0],
        "--base-image": cpu["args"]["CPU_BASE_IMAGE"],
        "--lock-sha256": cpu["args"]["LOCK_SHA256"],
        "--cuda-image": cuda["tags"][0],
        "--cuda-lock-sha256": cuda["args"]["LOCK_SHA256"],
    }
    args.update({f"--{k.replace('_', '-')}": v for k, v in change.items()})
    return [part for pair in args.items() for part in pair]


def test_bake_matches_the_tier_build_and_names_any_difference(tmp_path):
    printed = json.loads(BAKE.read_text())
    result = run("bake", str(BAKE), *bake_args(printed))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"bake: cpu -> {printed['target']['cpu']['tags'][0]}, "
        f"cuda -> {printed['target']['cuda']['tags'][0]}\n"
    )
    for change, key in (
        ({"image": "127.0.0.1:5099/lockstep-cpu:env-0000000000000000"}, "'cpu.tags'"),
        ({"base_image": "debian:bookworm-slim@sha256:" + "0" * 64}, "'cpu.args.CPU_BASE_IMAGE'"),
        ({"lock_sha256": "sha256:" + "0" * 64}, "'cpu.args.LOCK_SHA256'"),
        ({"cuda_image": "127.0.0.1:5099/lockstep-cuda:env-0000000000000000"}, "cuda.tags"),
        ({"cuda_lock_sha256": "sha256:" + "0" * 64}, "cuda.args.LOCK_SHA256"),
    ):
        assert failed(run("bake", str(BAKE), *bake_args(printed, **change)), key), change
    # A bake file whose cpu target builds another stage, or no cuda target at all.
    other = json.loads(BAKE.read_text())
    other["target"]["cpu"]["target"] = "cpu-build"
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert failed(run("bake", str(tmp_path / "other.json"), *bake_args(printed)), "'cpu.target'")
    # Both images start from the one base of docker/base.lock, for linux/amd64 alone.
    other = json.loads(BAKE.read_text())
    other["target"]["cuda"]["args"]["CPU_BASE_IMAGE"] = "nvidia/cuda:13@sha256:" + "0" * 64
    other["target"]["cuda"]["platforms"].append("linux/arm64")
    (tmp_path / "other.json").write_text(json.dumps(other))
    result = run("bake", str(tmp_path / "other.json"), *bake_args(printed))
    assert failed(result, "'cuda.platforms'") and "'cuda.args.CPU_BASE_IMAGE'" in result.stderr
    del other["target"]["cuda"]
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert failed(run("bake", str(tmp_path / "other.json"), *bake_args(printed)), "'cuda'")


def built(tmp_path: Path, **override: str) -> dict[str, str]:
    """A CPU image's inputs, its manifest (docker/write-manifest.py) and labels (the Dockerfile's
    cpu LABEL with the build arguments filled in) written to tmp_path."""
    digest = "sha256:" + "5" * 64
    inputs = {
        "image": "127.0.0.1:5099/lockstep-cpu:env-0123456789abcdef",
        "base_image": f"127.0.0.1:5099/lockstep-base/debian:bookworm-minbase@{digest}",
        "base_digest": digest,
        "git_revision": "0123abc-dirty",
        "build_time": "2026-11-24T22:23:14Z",
    }
    lock_sha256 = subprocess.run(
        ["bash", "-c", f"sha256sum {LOCK} | cut -d' ' -f1"], capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "docker" / "write-manifest.py"),
            *(f"--{k.replace('_', '-')}={v}" for k, v in inputs.items()),
            f"--lock={LOCK}",
            f"--expect-lock-sha256=sha256:{lock_sha256}",
            f"--out={tmp_path / 'manifest.json'}",
        ],
        check=True,
        capture_output=True,
    )
    build_args = {
        "GIT_REVISION": inputs["git_revision"],
        "BUILD_TIME": inputs["build_time"],
        "CPU_BASE_IMAGE": inputs["base_image"],
        "CPU_BASE_DIGEST": inputs["base_digest"],
        "LOCKSTEP_IMAGE": inputs["image"],
        "LOCK_SHA256": f"sha256:{lock_sha256}",
    }
    (label,) = [rest for ins, rest in stages()["cpu"] if ins == "LABEL"]
    labels = {
        key: re.sub(r"\$\{(\w+)\}", lambda m: build_args[m[1]], value.strip('"'))
        for key, value in re.findall(r'(\S+?)=("[^"]*"|\S+)', label)
    }
    labels.update(override)
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    return inputs


def identity(tmp_path: Path, inputs: dict[str, str], lock: Path = LOCK):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in inputs.items()]
    manifest, labels = tmp_path / "manifest.json", tmp_path / "labels.json"
    return run("identity", str(manifest), str(labels), *flags, f"--lock={lock}")


def test_identity_is_write_manifests_schema_and_the_dockerfiles_labels(tmp_path):
    inputs = built(tmp_path)
    result = identity(tmp_path, inputs)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads((tmp_path / "manifest.json").read_text())


@pytest.mark.parametrize(
    "change, why",
    [
        ({"git_revision": "fedcba9"}, "['git_revision'"),
        ({"image": "127.0.0.1:5099/lockstep-cpu:env-ffffffffffffffff"}, "['image'"),
        ({"build_time": "2026-11-25T00:00:00Z"}, "['build_time'"),
    ],
)
def test_identity_fails_on_a_manifest_from_other_inputs(tmp_path, change, why):
    inputs = built(tmp_path)
    assert failed(identity(tmp_path, {**inputs, **change}), why)


def test_identity_fails_on_a_label_a_lock_or_a_key_that_differs(tmp_path):
    inputs = built(tmp_path, **{"org.opencontainers.image.revision": "other"})
    assert failed(identity(tmp_path, inputs), "org.opencontainers.image.revision")

    inputs = built(tmp_path, **{"io.lockstep.lock.cpu.txt": "sha256:" + "0" * 64})
    assert failed(identity(tmp_path, inputs), "io.lockstep.lock.cpu.txt")

    inputs = built(tmp_path)
    other_lock = tmp_path / "cpu.txt"
    other_lock.write_bytes(LOCK.read_bytes() + b"\n")
    assert failed(identity(tmp_path, inputs, other_lock), "['locks'")

    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "extra": 1}))
    assert failed(identity(tmp_path, inputs), "['extra']")

    unpinned = {**inputs, "base_image": "debian:bookworm-slim"}
    assert failed(identity(tmp_path, unpinned), "not pinned by digest")


# What `lockstep fingerprint --lock /etc/lockstep/requirements/cuda.txt --json` wrote inside the
# CUDA image the tier built from requirements/cuda.txt (its torch and lock sections; the tier
# keeps the whole file as $LOCKSTEP_DOCKER_CACHE/last-cuda-fingerprint.json: copy those two
# sections here again when the lock's CUDA, cuDNN or NCCL pins change).
CUDA_FINGERPRINT = Path(__file__).parent / "data" / "cuda-fingerprint.json"
CUDA_LOCK = ROOT / "requirements" / "cuda.txt"


def cuda_stack(tmp_path: Path, fingerprint: dict, lock_text: str) -> subprocess.CompletedProcess:
    (tmp_path / "fp.json").write_text(json.dumps(fingerprint))
    (tmp_path / "cuda.txt").write_text(lock_text)
    return run("cuda-stack", str(tmp_path / "fp.json"), "--lock", str(tmp_path / "cuda.txt"))


def test_cuda_stack_passes_the_images_own_fingerprint_against_its_lock(tmp_path):
    fingerprint = json.loads(CUDA_FINGERPRINT.read_text())
    result = cuda_stack(tmp_path, fingerprint, CUDA_LOCK.read_text())
    assert result.returncode == 0, result.stderr
    torch = fingerprint["sections"]["torch"]
    assert torch["nccl"] and torch["cuda"] and torch["cudnn"]  # read in the image, no GPU
    assert result.stdout.startswith(f"CUDA {torch['cuda']}, cuDNN ")


def test_cuda_stack_fails_on_a_lock_naming_another_nccl_cudnn_or_cuda(tmp_path):
    fingerprint = json.loads(CUDA_FINGERPRINT.read_text())
    lock = CUDA_LOCK.read_text()
    for wheel, label in (
        ("nvidia-nccl-cu13", "NCCL"),
        ("nvidia-cudnn-cu13", "cuDNN"),
        ("nvidia-cuda-runtime", "CUDA"),
    ):
        other = re.sub(rf"^{wheel}==\S+", f"{wheel}==1.2.3", lock, flags=re.M)
        assert other != lock
        # lockstep's own comparison (in the image) saw it too: the tier checks both agree
        own = json.loads(json.dumps(fingerprint))
        own["sections"]["packages"]["lock"]["cuda_stack"]["matches"] = False
        result = cuda_stack(tmp_path, own, other)
        assert failed(result, f"differs from {tmp_path / 'cuda.txt'}: {label} "), result.stderr
        assert f"locked ({wheel}==1.2.3)" in result.stderr
        # and where lockstep's own comparison missed it, the tier says so
        missed = cuda_stack(tmp_path, fingerprint, other)
        assert failed(missed, "lockstep's fingerprint missed a CUDA stack difference")


def test_cuda_stack_fails_on_a_cpu_torch_or_a_lock_lockstep_says_differs(tmp_path):
    fingerprint = json.loads(CUDA_FINGERPRINT.read_text())
    cpu = json.loads(json.dumps(fingerprint))
    cpu["sections"]["torch"].update(cuda=None, cudnn=None, nccl=None)
    cpu["sections"]["packages"]["lock"]["cuda_stack"]["matches"] = False
    assert failed(cuda_stack(tmp_path, cpu, CUDA_LOCK.read_text()), "CUDA None built")
    extra = json.loads(json.dumps(fingerprint))
    extra["sections"]["packages"]["lock"].update(matches=False, extra={"pkg": "1"})
    assert failed(cuda_stack(tmp_path, extra, CUDA_LOCK.read_text()), "says the image differs")


def test_cuda_config_wants_the_toolkit_variables_and_a_user(tmp_path):
    env = ["PATH=/opt/lockstep/venv/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    config = {"User": "10001:10001", "Env": [*env, "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("cuda-config", str(path)).returncode == 0
    path.write_text(json.dumps({**config, "Env": env}))
    assert failed(run("cuda-config", str(path)), "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    path.write_text(json.dumps({**config, "User": ""}))
    assert failed(run("cuda-config", str(path)), "user 'root'")
