"""Which CUDA image a GPU run may use, decided by main's code alone (gpu.yml's `image` job).

The commit under test may be a pull request's. Its files are read here as data, never run or
sourced: `docker/base.lock` through a strict KEY=VALUE reader, the lock and the image's files only
hashed. Each is read only as a regular file of at most 1 MiB reached through no symbolic link (no
folder on its way is one either): a pull request's `docker/base.lock -> /etc/...` would otherwise
have its target read (and quoted in the refusal), and one to `/dev/zero` or a FIFO would hang the
job. The tag is the one `docker/build-args.sh` computes (tests/test_gpu_image.py holds the two
equal), so a pull request cannot choose the image by editing a script.

    python3 -I main/ci/gpu-image.py tag pr/                 # -> CUDA_TAG=env-<16 hex>
    python3 -I main/ci/gpu-image.py tag pr/ --owner OWNER   # and manifest=<JSON>: what the
        # image's /etc/lockstep/image-manifest.json must say (its name, base and lock digest),
        # which the GPU job compares with the manifest of the image it runs in
    python3 -I main/ci/gpu-image.py verify --image REF --repo OWNER/REPO --attestation FILE

`verify` refuses a reference that is not ghcr.io/<owner>/lockstep-cuda@sha256:<64 hex>, and
checks the JSON of `gh attestation verify --format json` (which has already checked the
signature against Sigstore's roots): a provenance statement whose subject is this image and
digest, signed by this repository's images.yml on refs/heads/main on a GitHub-hosted runner.
A tag moved by any other workflow with `packages: write` fails here. Standard library only.
Exit 0 with KEY=value lines for $GITHUB_OUTPUT; else 1 (refused) or 2 (bad input), one line.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path

# docker/build-args.sh hashes these, in this order, with `sha256sum` (then the base reference).
IMAGE_FILES = (
    "docker/Dockerfile",
    "docker/install-lock.sh",
    "docker/write-manifest.py",
    "docker/check-one-nccl.sh",
    "docker/lock-parts.py",
    "docker/deepspeed-build.env",
)
# One base for both images (docker/base.lock): the CUDA image's libraries are all lock wheels.
BASE_KEYS = ("CPU_BASE_IMAGE",)
# NAME[:TAG]@sha256:<64 hex>, registry and path in the characters a reference may hold.
PINNED_REFERENCE = re.compile(
    r"[a-z0-9][a-z0-9._/-]*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}"
)
KEY_VALUE = re.compile(r"([A-Z][A-Z0-9_]*)=(\S+)")
OWNER = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38})")
REPO = re.compile(r"([A-Za-z0-9-]{1,39})/([A-Za-z0-9._-]{1,100})")
ISSUER = "https://token.actions.githubusercontent.com"
PROVENANCE = "https://slsa.dev/provenance/v1"
SIGNER_REF = "refs/heads/main"
# The largest file of the commit read (requirements/cuda.txt is about 180 KB).
MAX_FILE_BYTES = 1 << 20


class Refused(Exception):
    """The input is well-formed but must not run: exit 1."""


class BadInput(Exception):
    """The input cannot be read: exit 2."""


def read_checkout_file(tree: Path, name: str) -> bytes:
    """tree/name, which must be a regular file of at most MAX_FILE_BYTES reached through no
    symbolic link. Opened one component at a time with O_NOFOLLOW, so nothing the checkout
    holds can point the read elsewhere between a check and the read."""
    path = tree / name
    try:
        fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise BadInput(f"{tree}: not a folder that can be read ({err.strerror})") from None
    try:
        parts = name.split("/")
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = tree.joinpath(*parts[: depth + 1])
            try:
                mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
            except OSError as err:
                raise Refused(f"{where}: {err.strerror.lower()}") from None
            if stat.S_ISLNK(mode):
                raise Refused(f"{where}: a symbolic link, read only as a regular file")
            if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                raise Refused(f"{where}: not a regular {'file' if last else 'folder'}")
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
            try:
                child = os.open(part, flags | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except OSError as err:
                why = "a symbolic link" if err.errno == errno.ELOOP else err.strerror.lower()
                raise Refused(f"{where}: {why}") from None
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise Refused(f"{path}: {info.st_size} bytes, over the {MAX_FILE_BYTES} read")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES and (chunk := os.read(fd, 65536)):
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:
            raise Refused(f"{path}: over the {MAX_FILE_BYTES} bytes read")
        return b"".join(chunks)
    except OSError as err:
        raise BadInput(f"{path}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)


def read_key_values(tree: Path, name: str, keys: tuple[str, ...]) -> dict[str, str]:
    """Comments, blank lines and exactly KEY=VALUE (one token, no quotes, no expansion)."""
    path = tree / name
    try:
        text = read_checkout_file(tree, name).decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(f"{path}: not UTF-8 ({err.reason})") from None
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = KEY_VALUE.fullmatch(line)
        if not match:
            raise Refused(f"{path}:{number}: not a KEY=VALUE line: {line[:80]!r}")
        key, value = match.groups()
        if key not in keys:
            raise Refused(f"{path}:{number}: unknown key {key} (expected {', '.join(keys)})")
        if key in values:
            raise Refused(f"{path}:{number}: {key} given twice")
        if not PINNED_REFERENCE.fullmatch(value):
            raise Refused(f"{path}:{number}: {key} is not NAME:TAG@sha256:<64 hex>: {value[:80]!r}")
        values[key] = value
    missing = [key for key in keys if key not in values]
    if missing:
        raise Refused(f"{path}: no {', '.join(missing)}")
    return values


def image_tag(tree: Path, variant: str = "cuda") -> str:
    """env-<16 hex> as build-args.sh: sha256 of `sha256sum LOCK FILES...` then the base line."""
    base = read_key_values(tree, "docker/base.lock", BASE_KEYS)["CPU_BASE_IMAGE"]
    listing = "".join(
        f"{hashlib.sha256(read_checkout_file(tree, name)).hexdigest()}  {name}\n"
        for name in (f"requirements/{variant}.txt", *IMAGE_FILES)
    )
    return "env-" + hashlib.sha256(f"{listing}{base}\n".encode()).hexdigest()[:16]


def expected_manifest(tree: Path, owner: str) -> dict:
    """The keys of the CUDA image's manifest that its inputs fix (docker/write-manifest.py
    writes them from the same files): its name and tag, its base, and its lock's digest."""
    if not OWNER.fullmatch(owner):
        raise BadInput(f"owner {owner!r} is not a lower-case GitHub owner name")
    base = read_key_values(tree, "docker/base.lock", BASE_KEYS)["CPU_BASE_IMAGE"]
    lock = read_checkout_file(tree, "requirements/cuda.txt")
    return {
        "image": f"ghcr.io/{owner}/lockstep-cuda:{image_tag(tree)}",
        "base_image": base,
        "base_digest": base.rsplit("@", 1)[1],
        "locks": {"cuda.txt": "sha256:" + hashlib.sha256(lock).hexdigest()},
    }


def check_reference(image: str, owner: str) -> str:
    """The digest of `image`, which must be this owner's lockstep-cuda by digest."""
    if not OWNER.fullmatch(owner):
        raise BadInput(f"owner {owner!r} is not a lower-case GitHub owner name")
    match = re.fullmatch(
        rf"ghcr\.io/{re.escape(owner)}/lockstep-cuda@sha256:([0-9a-f]{{64}})", image
    )
    if not match:
        raise Refused(f"image {image[:120]!r} is not ghcr.io/{owner}/lockstep-cuda@sha256:<64 hex>")
    return match.group(1)


def _problems(entry: object, name: str, digest: str, repo: str) -> list[str]:
    """Why one verified attestation does not vouch for name@sha256:digest (empty: it does)."""
    if not isinstance(entry, dict):
        return ["an entry is not an object"]
    result = entry.get("verificationResult") or {}
    statement = result.get("statement") or {}
    cert = (result.get("signature") or {}).get("certificate") or {}
    url = f"https://github.com/{repo}"
    workflow = f"{url}/.github/workflows/images.yml@{SIGNER_REF}"
    problems = []
    if statement.get("predicateType") != PROVENANCE:
        problems.append(f"predicate {statement.get('predicateType')!r} is not {PROVENANCE}")
    subjects = statement.get("subject") or []
    if not any(
        isinstance(s, dict)
        and s.get("name") == name
        and (s.get("digest") or {}).get("sha256") == digest
        for s in subjects
    ):
        problems.append(f"no subject {name}@sha256:{digest[:12]}…")
    expected = {
        "issuer": ISSUER,
        "sourceRepositoryURI": url,
        "sourceRepositoryRef": SIGNER_REF,
        "buildSignerURI": workflow,
        "runnerEnvironment": "github-hosted",
    }
    for field, value in expected.items():
        if cert.get(field) != value:
            problems.append(f"certificate {field} is {cert.get(field)!r}, not {value!r}")
    if not result.get("verifiedTimestamps"):
        problems.append("no verified timestamp")
    return problems


def check_attestation(document: object, image: str, repo: str) -> None:
    """Refused unless one verified entry vouches for exactly this image, built on main."""
    if not REPO.fullmatch(repo):
        raise BadInput(f"repo {repo!r} is not OWNER/REPO")
    owner = repo.split("/", 1)[0].lower()
    digest = check_reference(image, owner)
    name = image.split("@", 1)[0]
    if not isinstance(document, list) or not document:
        raise Refused(f"no verified attestation for {image}")
    reasons = [_problems(entry, name, digest, repo) for entry in document]
    if not any(not r for r in reasons):
        raise Refused(f"no attestation vouches for {image}: {'; '.join(reasons[0])}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-image.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tag = sub.add_parser("tag", help="CUDA_TAG of a checkout, read as data")
    tag.add_argument("tree", type=Path)
    tag.add_argument("--owner", help="also print manifest=<JSON> for ghcr.io/OWNER's image")
    verify = sub.add_parser("verify", help="the image reference and its build attestation")
    verify.add_argument("--image", required=True)
    verify.add_argument("--repo", required=True, help="OWNER/REPO (GITHUB_REPOSITORY)")
    verify.add_argument("--attestation", required=True, type=Path, help="gh ... --format json")
    args = parser.parse_args(argv)
    try:
        if args.command == "tag":
            print(f"CUDA_TAG={image_tag(args.tree)}")
            if args.owner is not None:
                expected = expected_manifest(args.tree, args.owner)
                print(f"manifest={json.dumps(expected, sort_keys=True, separators=(',', ':'))}")
            return 0
        try:
            document = json.loads(args.attestation.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise BadInput(
                f"{args.attestation}: not the JSON of gh attestation verify ({err})"
            ) from None
        check_attestation(document, args.image, args.repo)
        print(f"image={args.image}")
        return 0
    except Refused as err:
        print(f"gpu-image: refused: {err}", file=sys.stderr)
        return 1
    except BadInput as err:
        print(f"gpu-image: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
