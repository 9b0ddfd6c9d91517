"""The image manifest a locked image carries (written at build time by
docker/write-manifest.py): its name, base, locks and CUDA's needs."""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.errors import UsageError

MANIFEST_PATH = "/etc/lockstep/image-manifest.json"


def path() -> Path:
    """Where this process's image keeps its manifest (LOCKSTEP_IMAGE_MANIFEST overrides)."""
    return Path(os.environ.get("LOCKSTEP_IMAGE_MANIFEST", MANIFEST_PATH))


def read(where: Path | None = None) -> dict | None:
    """The manifest; None outside a locked image; a bad file ends with a one-line error."""
    where = where or path()
    return _parse(where)


def _parse(path: Path) -> dict | None:
    from lockstep.inputs import load_json, read_text

    if not os.path.exists(path):  # outside a locked image (a dangling link too)
        return None
    text = read_text(path, "image manifest")
    try:
        data = load_json(text, f"image manifest {path}")
    except UsageError as err:
        raise UsageError(f"{err}; rebuild the image") from None
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise UsageError(f"image manifest {path} is not schema 1; rebuild the image")
    return data
