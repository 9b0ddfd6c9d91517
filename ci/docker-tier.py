"""The Python steps of the CPU docker tier (ci/docker-tier.sh), one subcommand each.

    docker-tier.py port-free PORT              exit 0 if 127.0.0.1:PORT can be bound, else 1
    docker-tier.py wait-http URL SECONDS       until URL answers (exit 0), else 1 after SECONDS
    docker-tier.py bake BAKE_PRINT_JSON ...    docker-bake.hcl resolves to the tier's cpu build
    docker-tier.py identity MANIFEST LABELS ...  the built image's manifest and OCI labels are
                                               what docker/write-manifest.py makes of its inputs

Standard library only, run with the tier's $PYTHON. A failed check exits 1 with one line on
stderr beginning `docker-tier: error:`; bad usage exits 2 (argparse).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
    printed: dict, *, image: str, base_image: str, lock_sha256: str, cuda_tag: str
) -> str:
    """`docker buildx bake --print cpu cuda` gives the cpu build the tier runs (its tag, target,
    Dockerfile and build arguments) and the cuda tag build-args.sh computed, in the same registry."""
    targets = printed["target"]
    cpu, cuda = targets["cpu"], targets["cuda"]
    want = {
        "tags": [image],
        "target": "cpu",
        "dockerfile": "docker/Dockerfile",
        "args.CPU_BASE_IMAGE": base_image,
        "args.LOCK_SHA256": lock_sha256,
        "args.LOCKSTEP_IMAGE": image,
    }

    def get(target: dict, key: str) -> object:
        if key.startswith("args."):
            return target.get("args", {}).get(key.removeprefix("args."))
        return target.get(key)

    bad = {key: get(cpu, key) for key, value in want.items() if get(cpu, key) != value}
    registry = image.rsplit("/", 1)[0]
    if cuda.get("tags") != [f"{registry}/lockstep-cuda:{cuda_tag}"]:
        bad["cuda.tags"] = cuda.get("tags")
    if bad:
        raise Failed(f"bake resolves differently: {bad}")
    return f"bake: cpu -> {cpu['tags'][0]}, cuda -> {cuda['tags'][0]}"


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
    bake.add_argument("--cuda-tag", required=True)
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
                    cuda_tag=args.cuda_tag,
                )
            )
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
