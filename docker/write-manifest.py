"""Write /etc/lockstep/image-manifest.json: what `lockstep fingerprint` reads to name an image.

Runs inside the image build (stdlib only). It refuses a base image that is not pinned by
digest, a base digest that is not the reference's, and a lock whose bytes do not match the
digest given to the image's OCI labels, so the manifest and the labels say the same thing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

SCHEMA = 1
PINNED = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


# The oldest Linux driver of each CUDA major: CUDA's release notes (table 3, "CUDA Toolkit and
# Corresponding Driver Versions"), the GA release's driver; with CUDA's minor version
# compatibility every X.Y of that major runs on it. A CUDA major missing here fails the build.
MIN_DRIVER = {"12": "525.60.13", "13": "580.65.06"}
CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==([0-9][^\s;\\]*)", re.MULTILINE)


def cuda_section(locks: list[Path]) -> dict | None:
    """{"runtime", "min_driver"} of the lock pinning nvidia-cuda-runtime; None on CPU."""
    versions = {m[1] for path in locks for m in CUDA_RUNTIME.finditer(path.read_text())}
    if not versions:
        return None
    if len(versions) > 1:
        raise SystemExit(f"write-manifest: the locks pin several CUDA runtimes: {sorted(versions)}")
    (runtime,) = versions
    major = runtime.split(".")[0]
    if major not in MIN_DRIVER:
        raise SystemExit(
            f"write-manifest: no minimum driver known for CUDA {runtime}; add CUDA {major}'s to "
            "MIN_DRIVER in docker/write-manifest.py (CUDA's release notes)"
        )
    return {"runtime": runtime, "min_driver": MIN_DRIVER[major]}


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# Each OCI label of the image (docker/Dockerfile's final stages) and the manifest value it
# carries; a label naming the lock is io.lockstep.lock.<lock file name>. ci/docker-tier.py
# checks a built image's labels against its manifest with these.
LABELS = {
    "org.opencontainers.image.revision": "git_revision",
    "org.opencontainers.image.created": "build_time",
    "org.opencontainers.image.base.name": "base_image",
    "org.opencontainers.image.base.digest": "base_digest",
    "io.lockstep.image": "image",
}


def manifest(
    *,
    image: str,
    base_image: str,
    base_digest: str,
    locks: list[Path],
    git_revision: str,
    build_time: str,
    expect_lock_sha256: str = "",
) -> dict:
    """The manifest of an image built from these inputs; SystemExit where they disagree."""
    pinned = PINNED.match(base_image)
    if not pinned:
        raise SystemExit(
            f"write-manifest: base image {base_image!r} is not pinned by digest; "
            "pass NAME:TAG@sha256:<64 hex> (see docker/base.lock)"
        )
    if base_digest != pinned["digest"]:
        raise SystemExit(
            f"write-manifest: base digest {base_digest!r} is not the one in {base_image!r}; "
            "pass both from the same docker/base.lock line"
        )
    digests = {path.name: file_digest(path) for path in locks}
    if expect_lock_sha256 and set(digests.values()) != {expect_lock_sha256}:
        raise SystemExit(
            f"write-manifest: lock digest {sorted(digests.values())} differs from the build "
            f"argument {expect_lock_sha256}; recompute it from requirements/ (docker/build-args.sh)"
        )
    out = {
        "schema": SCHEMA,
        "image": image,
        "base_image": base_image,
        "base_digest": pinned["digest"],
        "locks": digests,
        "git_revision": git_revision,
        "build_time": build_time,
    }
    cuda = cuda_section(locks)
    if cuda:
        out["cuda"] = cuda
    return out


def build_manifest(args: argparse.Namespace) -> dict:
    return manifest(
        image=args.image,
        base_image=args.base_image,
        base_digest=args.base_digest,
        locks=[Path(lock) for lock in args.lock],
        git_revision=args.git_revision,
        build_time=args.build_time,
        expect_lock_sha256=args.expect_lock_sha256,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="image name:tag")
    parser.add_argument("--base-image", required=True, help="base image tag@sha256:digest")
    parser.add_argument("--base-digest", required=True, help="sha256:<hex> given to labels")
    parser.add_argument("--lock", action="append", required=True, help="lock file in the image")
    parser.add_argument("--expect-lock-sha256", default="", help="sha256:<hex> given to labels")
    parser.add_argument("--git-revision", required=True)
    parser.add_argument("--build-time", required=True)
    parser.add_argument("--out", default="/etc/lockstep/image-manifest.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(build_manifest(args), indent=2, sort_keys=True) + "\n")
    print(out.read_text(), end="", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
