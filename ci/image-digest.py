"""Print the reference to launch an image by, NAME@sha256:..., from a buildx metadata file.

    docker buildx bake -f docker/docker-bake.hcl --metadata-file out/bake.json --push cpu
    python ci/image-digest.py out/bake.json cpu     # -> registry/lockstep-cpu@sha256:...

bake's file holds one entry per target; `docker buildx build --metadata-file` writes the one
image's entry at the top level, which is read as a single unnamed target.

`containerimage.digest` is the manifest digest a registry serves (what every node pulls by);
the tag is dropped because a digest reference names exactly one image. With one target in the
file the target name may be left out. Exit 2 with one line when the file does not say.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

USAGE = "usage: image-digest.py METADATA_JSON [TARGET] [--name NAME]"


def launch_reference(metadata: dict, target: str | None, name: str | None = None) -> str:
    """`name` stands in where the file has no image.name (buildx 0.13's docker driver)."""
    if not isinstance(metadata, dict):
        raise ValueError("not the JSON object buildx writes")
    if "containerimage.digest" in metadata:  # `buildx build`: one image, no target names
        metadata = {target or "image": metadata}
    # bake also writes top-level entries that are not targets (buildx.build.warnings).
    metadata = {name: entry for name, entry in metadata.items() if isinstance(entry, dict)}
    if target is None:
        if len(metadata) != 1:
            raise ValueError(f"name a target, the file holds {sorted(metadata)}")
        (target,) = metadata
    if target not in metadata:
        raise ValueError(f"no target {target!r} in the file (it holds {sorted(metadata)})")
    entry = metadata[target]
    digest = entry.get("containerimage.digest", "")
    names = entry.get("image.name", name or "")
    names = [n for n in names.split(",") if n] if isinstance(names, str) else []
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not names:
        raise ValueError(f"target {target!r} has no image.name and containerimage.digest")
    name = names[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return f"{repository}@{digest}"


def main(argv: list[str]) -> int:
    name = None
    if "--name" in argv:
        i = argv.index("--name")
        if i + 1 >= len(argv):
            print(USAGE, file=sys.stderr)
            return 2
        name = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if not 1 <= len(argv) <= 2:
        print(USAGE, file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        metadata = json.loads(path.read_text())
        print(launch_reference(metadata, argv[1] if len(argv) > 1 else None, name))
    except (OSError, ValueError, RecursionError) as err:
        why = "nested too deep" if isinstance(err, RecursionError) else err
        print(f"image-digest: error: {path}: {why}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
