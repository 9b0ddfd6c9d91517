"""The wheel users install holds what they run and nothing of development: built for real with
pip (setuptools, no build isolation, nothing downloaded) from a copy of this checkout as a fresh
clone has it, then its files read."""

from __future__ import annotations

import configparser
import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a fresh clone does not have: git's folder, venvs, build outputs, tools' caches. A stale
# build/ in particular: setuptools builds in the tree and copies build/lib into the wheel as it
# finds it, deleted modules included.
NOT_CLONED = (".git", ".nox", ".venv", "build", "dist", "wandb", "runs", "out", ".*cache")
ANYWHERE = ("__pycache__", "*.egg-info")


def _not_cloned(folder: str, names: list[str]) -> list[str]:
    patterns = ANYWHERE + (NOT_CLONED if Path(folder) == ROOT else ())
    return [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[zipfile.ZipFile, Path]:
    """(the built wheel, the copy of the checkout it was built from)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=_not_cloned, symlinks=True)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--no-cache-dir", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "-w", str(tmp / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = (tmp / "dist").glob("lockstep-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive, tree


def test_the_wheel_holds_lockstep_and_its_metadata_only(wheel):
    archive, _ = wheel
    names = archive.namelist()
    (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[0] for n in names} == {"lockstep", dist_info}
    assert archive.read(f"{dist_info}/top_level.txt").decode().split() == ["lockstep"]
    # no test bed (it lives in testbed/, development only), no tests, no benchmarks
    assert not [n for n in names if n.startswith("lockstep/cluster/") or "testbed" in n]
    tests = [n for n in names if fnmatch.fnmatch(Path(n).name, "test_*.py")]
    tests += [n for n in names if Path(n).name == "conftest.py" or "/tests/" in n]
    assert not tests


def test_every_file_of_the_package_ships(wheel):
    """The package's modules and the data its code loads (the default alert rules, the
    flight recorder's sitecustomize, a folder without __init__.py), and py.typed."""
    archive, tree = wheel
    src = tree / "src"
    package = {
        p.relative_to(src).as_posix()
        for p in (src / "lockstep").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    names = set(archive.namelist())
    assert package <= names, sorted(package - names)
    assert {n for n in names if n.startswith("lockstep/")} == package
    for loaded in (
        "lockstep/default-alerts.toml",
        "lockstep/py.typed",
        "lockstep/__main__.py",
        "lockstep/forensics/site/sitecustomize.py",
    ):
        assert loaded in names


def test_the_command_and_the_pytest_plugin_are_entry_points(wheel):
    archive, _ = wheel
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    points = configparser.ConfigParser()
    points.read_string(archive.read(entry_points).decode())
    assert dict(points["console_scripts"]) == {"lockstep": "lockstep.cli:console"}
    assert dict(points["pytest11"]) == {"lockstep": "lockstep.testing.plugin"}
    names = archive.namelist()
    assert "lockstep/cli.py" in names and "lockstep/testing/plugin.py" in names
