"""The wheel is the product: build lockstep's sdist and wheel from the tracked files (`python -m
build`, no isolation: the locked setuptools), `twine check` both, install the wheel into a fresh
venv in a folder away from the source tree, and run there what a user runs first:
`lockstep preflight --nproc 2`, `lockstep check determinism` on examples/train_protocol.py and
one test of the pytest plugin (loaded through the wheel's entry point).

The venv's dependencies are the locked CPU venv's packages, seen through a path entry that
leaves lockstep's own editable install out, so lockstep itself comes only from the wheel.

    python ci/wheel-check.py      # the locked venv's python (nox -s wheel); exit 0 when all ran
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_TEST = """\
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2)
def test_all_reduce(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == world_size * (world_size + 1) / 2
"""


def run(*cmd: str | Path, cwd: Path, env: dict | None = None) -> None:
    print("wheel-check: $", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=True, timeout=900)


def tracked_tree(into: Path) -> Path:
    """The files git tracks (a fresh clone's), copied: no build/, egg-info or caches."""
    files = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def dependencies(into: Path) -> Path:
    """This venv's packages, less lockstep's editable install, as links in one folder."""
    site = Path(sysconfig.get_paths()["purelib"])
    into.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(("lockstep", "__editable__")):
            (into / entry.name).symlink_to(entry)
    return into


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lockstep-wheel-") as scratch:
        work = Path(scratch)
        tree = tracked_tree(work / "tree")
        dist = work / "dist"
        run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
            "--outdir", dist, tree, cwd=work)  # fmt: skip
        built = sorted(dist.iterdir())
        run(sys.executable, "-m", "twine", "check", "--strict", *built, cwd=work)
        (wheel,) = [p for p in built if p.suffix == ".whl"]
        venv = work / "venv"
        run(sys.executable, "-m", "venv", venv, cwd=work)
        site = next(venv.glob("lib/python3*/site-packages"))
        (site / "lockstep-deps.pth").write_text(f"{dependencies(work / 'deps')}\n")
        python = venv / "bin" / "python"
        run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=work)
        user = work / "user"
        user.mkdir()
        shutil.copy(ROOT / "examples" / "train_protocol.py", user / "train.py")
        (user / "test_plugin.py").write_text(PLUGIN_TEST)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
        where = "import lockstep, sys; assert lockstep.__file__.startswith(sys.prefix), lockstep.__file__"
        run(python, "-c", where, cwd=user, env=env)
        run(venv / "bin" / "lockstep", "preflight", "--nproc", "2", cwd=user, env=env)
        run(venv / "bin" / "lockstep", "check", "determinism", "--script", "train.py",
            "--nproc", "2", "--steps", "4", cwd=user, env=env)  # fmt: skip
        run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plugin.py",
            cwd=user, env=env)  # fmt: skip
    print(f"wheel-check: {wheel.name} installed and ran preflight, a check and a plugin test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
