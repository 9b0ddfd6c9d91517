"""ci/check-tmp-paths.py (in `nox -s lint`): the repository's scripts name no fixed /tmp path,
and one planted in a copy of them fails the check with its file and line. The lines planted are
the ones ci/gpu-offline.sh and ci/setup-gpu-runner.sh had: a local user who made /tmp/site or
/tmp/actions-runner-*.tar.gz first ran code as whoever ran them (root, for the runner)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "check-tmp-paths.py"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def copy(tmp_path):
    """What the check scans, copied from the repository."""
    root = tmp_path / "repo"
    for folder in ("ci", "docker", ".github/workflows", "smoke"):
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / folder, root / folder, ignore=ignore)
    for name in (".ci/run", "noxfile.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_repository_names_no_fixed_tmp_path():
    got = check(ROOT)
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout == ""


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("ci/gpu-offline.sh", "python3 -m pip install --target /tmp/site .whl/*.whl"),
        ("ci/gpu-offline.sh", 'export PYTHONPATH="$PWD/src:/tmp/site"'),
        ("ci/gpu-offline.sh", "OUT=${OUT:-/tmp/gpu-out}"),
        ("ci/setup-gpu-runner.sh", 'curl -fsSL -o "/tmp/$tarball" "$url"'),
        ("ci/new-script.sh", "echo hi > /tmp"),
        (".github/workflows/ci.yml", "      - run: tar -xzf out.tgz -C /tmp/out"),
        ("noxfile.py", 'LOG = "/tmp/nox.log"'),
    ],
)
def test_a_planted_fixed_tmp_path_fails_the_check(copy, where, line):
    path = copy / where
    before = path.read_text().splitlines() if path.exists() else []
    path.write_text("\n".join([*before, line]) + "\n")
    got = check(copy)
    assert got.returncode == 1, got.stdout + got.stderr
    what = line.split('"')[1] if where.endswith(".py") else line.strip()  # Python: the string
    assert got.stdout.splitlines() == [
        f"check-tmp-paths: {where}:{len(before) + 1}: a fixed /tmp path ({what}): make "
        "the folder with `mktemp -d` and remove it in a trap (or list the file in ALLOWED with "
        "why)"
    ], got.stdout


@pytest.mark.parametrize(
    "line",
    [
        "work=$(mktemp -d /tmp/lockstep-x.XXXXXX)",
        "# OUT=/tmp/gpu-out bash ci/gpu-offline.sh   (a comment)",
        'cache=/var/tmp/x "$HOME/tmp/y" ./tmp/z',
        'def f():\n    """Writes /tmp/x (a docstring)."""',
    ],
)
def test_a_fresh_folder_a_comment_or_another_tmp_is_not_flagged(copy, line):
    where = "noxfile.py" if line.startswith("def ") else "ci/gpu-offline.sh"
    path = copy / where
    path.write_text(path.read_text() + line + "\n")
    got = check(copy)
    assert got.returncode == 0, got.stdout


def test_an_allowance_that_outlived_its_reason_is_reported(copy):
    (copy / "docker" / "install-lock.sh").write_text("#!/bin/sh\nwork=$(mktemp -d)\n")
    got = check(copy)
    assert got.returncode == 1
    assert got.stdout == (
        "check-tmp-paths: docker/install-lock.sh: listed in ALLOWED but names no fixed /tmp "
        "path now; drop it\n"
    )
