"""The image manifest a locked image carries (docker/write-manifest.py writes it at build time):
its name, base, locks and, in the CUDA image, the CUDA runtime and the oldest driver it needs."""

from __future__ import annotations

import json
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
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UsageError(f"cannot read image manifest {path}: {err.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"image manifest {path} is not JSON ({err.msg}); rebuild the image"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise UsageError(f"image manifest {path} is not schema 1; rebuild the image")
    return data
