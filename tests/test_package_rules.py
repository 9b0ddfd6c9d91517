"""The package rules `nox -s lint` keeps (issue #25, item 8): import-linter's contracts in
pyproject.toml, and ci/check-private-imports.py, run here for real on source trees in tmp
folders (the checker parses, never imports)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "check-private-imports.py"


def check(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    for name, text in {"lockstep/__init__.py": "", **files}.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(src).parents:
            init = src / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
        path.write_text(textwrap.dedent(text))
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(src)], capture_output=True, text=True, check=False
    )


OWNERS = {
    "lockstep/checks/script.py": "def _diagnosis(): ...\n__all__ = []\n",
    "lockstep/checks/_wording.py": "WORDS = 1\n",
    "lockstep/redact.py": "def _scrub(): ...\n",
}


@pytest.mark.parametrize(
    "importer, source",
    [
        # another package's private function, module, or a name under a private module
        ("lockstep/gate/job.py", "from lockstep.checks.script import _diagnosis"),
        ("lockstep/gate/job.py", "from lockstep.checks import _wording"),
        ("lockstep/gate/job.py", "from lockstep.checks._wording import WORDS"),
        ("lockstep/gate/job.py", "import lockstep.checks._wording"),
        # relative imports are resolved first
        ("lockstep/gate/job.py", "from ..checks.script import _diagnosis"),
        ("lockstep/gate/__init__.py", "from ..checks.script import _diagnosis"),
        # a top-level module is a unit of its own; lockstep/__init__.py belongs to none
        ("lockstep/cli.py", "from lockstep.redact import _scrub"),
        ("lockstep/__init__.py", "from .redact import _scrub"),
        # inside a function too
        ("lockstep/train/cli.py", "def f():\n    from lockstep.checks.script import _diagnosis\n"),
    ],
)
def test_another_packages_private_name_is_a_breach(tmp_path, importer, source):
    result = check(tmp_path, {**OWNERS, importer: source})
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"src/{importer}:") and "a private name of lockstep." in line
    assert "1 breach(es)" in result.stderr


@pytest.mark.parametrize(
    "importer, source",
    [
        ("lockstep/checks/harness.py", "from lockstep.checks.script import _diagnosis"),
        (
            "lockstep/checks/harness.py",
            "from .script import _diagnosis\nfrom ._wording import WORDS",
        ),
        ("lockstep/checks/sub/deep.py", "from ..script import _diagnosis"),
        ("lockstep/redact.py", "from lockstep.redact import _scrub"),
        ("lockstep/gate/job.py", "from lockstep.checks.script import __all__"),
        ("lockstep/gate/job.py", "from lockstep.checks.script import *"),
        ("lockstep/gate/job.py", "from numpy._core.multiarray import _reconstruct"),
    ],
)
def test_own_package_public_and_dunder_names_pass(tmp_path, importer, source):
    result = check(tmp_path, {**OWNERS, importer: source})
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


@pytest.mark.parametrize(
    "source, shown",
    [
        ("import torch\nv = torch._C._nccl_version()", "torch._C._nccl_version"),
        ("import torch.distributed as dist\ndist.distributed_c10d._get_default_group()",
         "torch.distributed.distributed_c10d._get_default_group"),
        ("import torch.distributed as dist\nc10d = dist.distributed_c10d\nc10d._world.pg_map",
         "torch.distributed.distributed_c10d._world"),
        ("from torch.distributed import distributed_c10d as c\nc._world",
         "torch.distributed.distributed_c10d._world"),
        ("from torch.distributed.fsdp._runtime_utils import x", "torch.distributed.fsdp._runtime_utils.x"),
        ("from torch import _dynamo", "torch._dynamo"),
        ("import torch._dynamo", "torch._dynamo"),
        ("import torch\nhasattr(torch._C, 'x')", "torch._C"),
        ("import torch\ngetattr(torch.cuda, '_lazy_init')()", "torch.cuda._lazy_init"),
        ("from deepspeed.utils import groups\ngroups._WORLD_GROUP = None", "deepspeed.utils.groups._WORLD_GROUP"),
    ],
)  # fmt: skip
def test_torch_and_deepspeed_private_apis_only_in_compat(tmp_path, source, shown):
    result = check(tmp_path, {"lockstep/train/engine.py": source})
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("src/lockstep/train/engine.py:"), result.stdout
    assert f"uses {shown}:" in result.stdout or f"imports {shown}:" in result.stdout
    assert "outside lockstep/compat.py" in result.stdout
    assert check(tmp_path / "compat", {"lockstep/compat.py": source}).returncode == 0


def test_public_torch_and_private_names_of_other_objects_pass(tmp_path):
    source = """
        import torch
        import torch.distributed as dist
        t = torch.zeros(1)
        t._version, dist.get_rank, torch.__version__
        class A:
            _x = 1
        A._x
        _private = 1
    """
    assert check(tmp_path, {"lockstep/train/engine.py": source}).returncode == 0


def test_a_file_that_does_not_parse_exits_2(tmp_path):
    result = check(tmp_path, {"lockstep/bad.py": "def ("})
    assert result.returncode == 2 and result.stderr.startswith("check-private-imports: error:")


def test_import_linter_contracts_are_the_package_rules():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_package"] == "lockstep"
    rules = {
        (c["type"], tuple(c["source_modules"]), tuple(c["forbidden_modules"]))
        for c in config["contracts"]
    }
    assert rules == {
        ("forbidden", ("lockstep.train",), ("lockstep.gate",)),
        ("forbidden", ("lockstep.gate",), ("lockstep.train",)),
        ("forbidden", ("lockstep.gate",), ("lockstep.checks",)),
    }
    noxfile = (ROOT / "noxfile.py").read_text()
    lint = noxfile[noxfile.index("def lint(") : noxfile.index("def smoke(")]
    assert "lint-imports" in lint and "ci/check-private-imports.py" in lint
    assert "import-linter" in noxfile[: noxfile.index("def lint(")]
