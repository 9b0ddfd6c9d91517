"""ci/image-digest.py on metadata files buildx would not write: one line and exit 2, never a
traceback (the file is read by images.yml's publish job before it names what is pushed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "image-digest.py"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "[1]",
        '"a string"',
        '{"cpu": {"containerimage.digest": 5, "image.name": "r/cpu"}}',
        '{"cpu": {"containerimage.digest": "sha256:' + "a" * 64 + '", "image.name": ["r"]}}',
    ],
)
def test_metadata_of_another_shape_is_one_line_and_exit_2(tmp_path, text):
    metadata = tmp_path / "bake.json"
    metadata.write_text(text)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(metadata), "cpu"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("image-digest: error: ")
    assert len(result.stderr.splitlines()) == 1
