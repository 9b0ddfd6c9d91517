"""The Python steps of the docker tier (ci/docker-tier.sh), one subcommand each.

    docker-tier.py port-free PORT              exit 0 if 127.0.0.1:PORT can be bound, else 1
    docker-tier.py wait-http URL SECONDS       until URL answers (exit 0), else 1 after SECONDS
    docker-tier.py bake BAKE_PRINT_JSON ...    docker-bake.hcl resolves to the tier's builds
    docker-tier.py identity MANIFEST LABELS ...  the built image's manifest and OCI labels are
                                               what docker/write-manifest.py makes of its inputs
    docker-tier.py cuda-config CONFIG_JSON     the CUDA image's user and NVIDIA toolkit variables
    docker-tier.py cuda-stack FINGERPRINT --lock LOCK
                                               torch's CUDA, cuDNN and NCCL in the fingerprint
                                               are the lock's nvidia-* pins, and lockstep's own
                                               comparison with that lock says the same

Standard library only, run with the tier's $PYTHON. A failed check exits 1 with one line on
stderr beginning `docker-tier: error:`; bad usage exits 2 (argparse).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


class Failed(Exception):
    """A check that did not pass: exit 1."""


def write_manifest() -> ModuleType:
    """docker/write-manifest.py, the manifest's schema, loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "write_manifest", ROOT / "docker" / "write-manifest.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def port_free(port: int) -> bool:
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError:
        return False
    return True


def wait_http(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise Failed(f"{url} did not answer: {err}") from None
            time.sleep(0.3)


def check_bake(
    printed: dict,
    *,
    image: str,
    base_image: str,
    lock_sha256: str,
    cuda_image: str,
    cuda_lock_sha256: str,
) -> str:
    """`docker buildx bake --print cpu cuda` gives the builds the tier runs: for each target its
    tag, stage, Dockerfile and build arguments, both from the one base (what images.yml
    publishes is these targets with only that base's source differing)."""
    targets = printed["target"]

    def want(variant: str, tag: str, lock: str) -> dict:
        return {
            "tags": [tag],
            "target": variant,
            "dockerfile": "docker/Dockerfile",
            "platforms": ["linux/amd64"],
            "args.CPU_BASE_IMAGE": base_image,
            "args.LOCK_SHA256": lock,
            "args.LOCKSTEP_IMAGE": tag,
        }

    def get(target: dict, key: str) -> object:
        if key.startswith("args."):
            return target.get("args", {}).get(key.removeprefix("args."))
        return target.get(key)

    bad = {}
    for variant, tag, lock in (
        ("cpu", image, lock_sha256),
        ("cuda", cuda_image, cuda_lock_sha256),
    ):
        target = targets[variant]
        for key, value in want(variant, tag, lock).items():
            if get(target, key) != value:
                bad[f"{variant}.{key}"] = get(target, key)
    if bad:
        raise Failed(f"bake resolves differently: {bad}")
    return f"bake: cpu -> {image}, cuda -> {cuda_image}"


# The CUDA image's settings for the NVIDIA container toolkit (docker/Dockerfile's cuda stage).
CUDA_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
# What the fingerprint reports -> the lock's wheel and how many version parts are compared.
CUDA_STACK = {
    "CUDA": ("cuda", re.compile(r"nvidia-cuda-runtime(?:-cu\d+)?"), 2),
    "cuDNN": ("cudnn", re.compile(r"nvidia-cudnn-cu\d+"), 3),
    "NCCL": ("nccl", re.compile(r"nvidia-nccl-cu\d+"), 3),
}


def check_cuda_config(config: dict) -> str:
    """A non-root user and the toolkit's variables, as `docker image inspect` shows them."""
    env = config.get("Env") or []
    missing = [pair for pair in CUDA_ENV if pair not in env]
    user = str(config.get("User") or "root").split(":")[0]
    if missing or user in ("", "0", "root"):
        raise Failed(f"CUDA image config: missing {missing}, user {user!r}")
    return f"user {config['User']}, {', '.join(CUDA_ENV)}"


def lock_pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line of a hashed lock (names normalised)."""
    pins = {}
    for match in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", text, re.M):
        pins[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return pins


def cudnn_dotted(value: object) -> str | None:
    """torch.backends.cudnn.version()'s integer as major.minor.patch (cuDNN 9: 92000 = 9.20.0)."""
    if not isinstance(value, int) or value <= 0:
        return None
    major, rest = (value // 10000, value % 10000) if value >= 10000 else divmod(value, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def check_cuda_stack(fingerprint: dict, lock_text: str, lock_name: str) -> str:
    """The fingerprint's torch section against the lock's nvidia-* pins, compared here (not
    trusting lockstep's own comparison), and then lockstep's own verdict must agree."""
    torch = fingerprint["sections"]["torch"]
    built = {
        "cuda": torch.get("cuda"),
        "cudnn": cudnn_dotted(torch.get("cudnn")),
        "nccl": torch.get("nccl"),
    }
    pins = lock_pins(lock_text)
    shown, differ = [], []
    for label, (key, wheel, parts) in CUDA_STACK.items():
        names = [name for name in pins if wheel.fullmatch(name)]
        if len(names) != 1:
            raise Failed(f"{lock_name} pins {len(names)} {wheel.pattern} wheels, not one")
        locked = ".".join(pins[names[0]].split(".")[:parts])
        have = built[key]
        shown.append(f"{label} {have}")
        if have is None or ".".join(str(have).split(".")[:parts]) != locked:
            differ.append(f"{label} {have} built, {locked} locked ({names[0]}=={pins[names[0]]})")
    lock = fingerprint["sections"]["packages"].get("lock") or {}
    own = (lock.get("cuda_stack") or {}).get("matches")
    if differ:
        if own is not False:
            raise Failed(
                f"lockstep's fingerprint missed a CUDA stack difference: {'; '.join(differ)}"
            )
        raise Failed(f"the image's CUDA stack differs from {lock_name}: {'; '.join(differ)}")
    if own is not True or not lock.get("matches"):
        raise Failed(f"lockstep's fingerprint says the image differs from {lock_name}: {lock}")
    return f"{', '.join(shown)}: as {lock_name} pins them"


def check_identity(manifest: dict, labels: dict, expected: dict) -> None:
    """The image's manifest is `expected` (write-manifest.py's, from the tier's own inputs), key
    for key, and each OCI label carries the manifest value write-manifest.py says it does."""
    schema = write_manifest()
    pairs = {label: manifest.get(key) for label, key in schema.LABELS.items()}
    for name, digest in (manifest.get("locks") or {}).items():
        pairs[f"io.lockstep.lock.{name}"] = digest
    bad = [key for key in expected if manifest.get(key) != expected[key]]
    bad += [label for label, value in pairs.items() if labels.get(label) != value]
    if bad or set(manifest) != set(expected):
        raise Failed(f"manifest/labels disagree on {bad or sorted(set(manifest) ^ set(expected))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    port = sub.add_parser("port-free")
    port.add_argument("port", type=int)
    http = sub.add_parser("wait-http")
    http.add_argument("url")
    http.add_argument("seconds", type=float)
    bake = sub.add_parser("bake")
    bake.add_argument("printed", type=Path, help="what `docker buildx bake --print` wrote")
    bake.add_argument("--image", required=True, help="the cpu image's tag, registry included")
    bake.add_argument("--base-image", required=True)
    bake.add_argument("--lock-sha256", required=True)
    bake.add_argument("--cuda-image", required=True, help="the cuda image's tag, registry included")
    bake.add_argument("--cuda-lock-sha256", required=True)
    config = sub.add_parser("cuda-config")
    config.add_argument("config", type=Path, help="`docker image inspect` .Config as JSON")
    stack = sub.add_parser("cuda-stack")
    stack.add_argument("fingerprint", type=Path, help="`lockstep fingerprint --json` in the image")
    stack.add_argument("--lock", type=Path, required=True)
    identity = sub.add_parser("identity")
    identity.add_argument("manifest", type=Path, help="/etc/lockstep/image-manifest.json's copy")
    identity.add_argument("labels", type=Path, help="the image's labels as a JSON object")
    identity.add_argument("--image", required=True)
    identity.add_argument("--base-image", required=True)
    identity.add_argument("--base-digest", required=True)
    identity.add_argument("--lock", type=Path, required=True)
    identity.add_argument("--git-revision", required=True)
    identity.add_argument("--build-time", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "port-free":
            return 0 if port_free(args.port) else 1
        if args.command == "wait-http":
            wait_http(args.url, args.seconds)
        elif args.command == "bake":
            printed = json.loads(args.printed.read_text())
            print(
                check_bake(
                    printed,
                    image=args.image,
                    base_image=args.base_image,
                    lock_sha256=args.lock_sha256,
                    cuda_image=args.cuda_image,
                    cuda_lock_sha256=args.cuda_lock_sha256,
                )
            )
        elif args.command == "cuda-config":
            print(check_cuda_config(json.loads(args.config.read_text())))
        elif args.command == "cuda-stack":
            fingerprint = json.loads(args.fingerprint.read_text())
            print(check_cuda_stack(fingerprint, args.lock.read_text(), str(args.lock)))
        else:
            manifest = json.loads(args.manifest.read_text())
            labels = json.loads(args.labels.read_text())
            expected = write_manifest().manifest(
                image=args.image,
                base_image=args.base_image,
                base_digest=args.base_digest,
                locks=[args.lock],
                git_revision=args.git_revision,
                build_time=args.build_time,
            )
            check_identity(manifest, labels, expected)
            print(json.dumps(manifest, indent=2))
    except (Failed, OSError, ValueError, KeyError, TypeError, SystemExit) as err:
        why = err if not isinstance(err, KeyError) else f"no {err} in the input"
        print(f"docker-tier: error: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
