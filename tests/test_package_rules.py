"""The package rules `nox -s lint` keeps (issue #25, item 8): import-linter's contracts in
pyproject.toml, and ci/check-private-imports.py, run here for real on source trees in tmp
folders (the checker parses, never imports)."""

from __future__ import annotations

import os
import shutil
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


LAYERS = [
    "__main__",
    "cli | action",
    "gate | checks",
    "reference_job",
    "train",
    "preflight",
    "env",
    "testing",
    "launch",
    "forensics | integrations",
    "alerts | run_health",
    "track",
    "state_digest",
    "errors : redact : compat : extras : summary_md : job_options : module_digest : inputs : terminal"
    " : local_batch : flags : registry",
]


def test_import_linter_contracts_are_the_package_rules():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_package"] == "lockstep"
    by_type = {c["type"]: c for c in config["contracts"]}
    layers = by_type["layers"]
    assert layers["containers"] == ["lockstep"] and layers["exhaustive"] is True
    assert layers["layers"] == LAYERS
    assert by_type["acyclic_siblings"]["ancestors"] == ["lockstep"]
    noxfile = (ROOT / "noxfile.py").read_text()
    lint = noxfile[noxfile.index("def lint(") : noxfile.index("def smoke(")]
    assert "lint-imports" in lint and "ci/check-private-imports.py" in lint
    assert "ci/check-sizes.py" in lint
    assert "import-linter" in noxfile[: noxfile.index("def lint(")]


def lint_imports(tmp_path: Path, plant: dict[str, str]) -> subprocess.CompletedProcess:
    """import-linter's own command with the repository's contracts, on a copy of src/lockstep
    with `plant` ({path under lockstep/: source}) written over it."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "lockstep", src / "lockstep", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name, text in plant.items():
        (src / "lockstep" / name).write_text(textwrap.dedent(text))
    command = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(command), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(src)},
        check=False,
    )


def test_the_tree_keeps_the_contracts(tmp_path):
    result = lint_imports(tmp_path, {})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def test_a_planted_upward_import_and_cycle_fail_lint_imports(tmp_path):
    errors = (ROOT / "src/lockstep/errors.py").read_text()
    plant = {
        # an upward import, inside a function: a base module reaching up to a command
        "errors.py": errors + "\n\ndef _planted():\n    from lockstep.gate import cli\n",
        # two siblings that import each other
        "gate/planted_a.py": "from lockstep.gate import planted_b\n",
        "gate/planted_b.py": "from lockstep.gate import planted_a\n",
    }
    result = lint_imports(tmp_path, plant)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "lockstep.errors is not allowed to import lockstep.gate" in result.stdout
    assert "No cycles are allowed in lockstep.gate" in result.stdout
    assert "Contracts: 2 kept, 2 broken" in result.stdout


def test_a_module_no_layer_places_fails_lint_imports(tmp_path):
    result = lint_imports(tmp_path, {"planted.py": "X = 1\n"})
    assert result.returncode == 1
    assert "The following modules are not listed as layers:\n\n- lockstep.planted" in result.stdout


SIZES = ROOT / "ci" / "check-sizes.py"


def check_sizes(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    for name, text in {"lockstep/__init__.py": "", **files}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-I", str(SIZES), str(src)], capture_output=True, text=True, check=False
    )


def test_a_long_module_and_a_long_function_fail_the_size_rule(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    files = {
        "lockstep/long.py": "X = 1\n" * 451,
        "lockstep/fine.py": "X = 1\n" * 450,
        "lockstep/f.py": f"class A:\n    def method(self):\n{'    ' + body.replace(chr(10) + '    ', chr(10) + '        ')}",
        "lockstep/g.py": f"def ok():\n{''.join(f'    y{i} = {i}' + chr(10) for i in range(79))}",
    }
    result = check_sizes(tmp_path, files)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == [
        "src/lockstep/f.py:2: function A.method is 81 lines, over 80: split it",
        "src/lockstep/long.py:1: 451 lines, over 450: cut it along its concepts",
    ]


def test_the_tree_keeps_the_size_rule():
    result = subprocess.run(
        [sys.executable, "-I", str(SIZES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_a_test_importing_a_private_name_of_lockstep_is_a_breach(tmp_path):
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "sub" / "test_x.py").write_text(
        "import torch._C\nfrom lockstep.checks import script\nfrom lockstep.checks.script import _diagnosis\n"
    )
    result = check(tmp_path, OWNERS)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "tests/sub/test_x.py:3: imports lockstep.checks.script._diagnosis: a private name of "
        "lockstep.checks from outside it"
    ]


def test_the_shipped_package_importing_the_test_bed_fails_lint_imports(tmp_path):
    """The wheel holds no test bed (testbed/, development only): lockstep importing it would
    break every install. testbed/importlinter.toml, which `nox -s lint` checks too, says so."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "src" / "lockstep", src / "lockstep", ignore=ignore)
    shutil.copytree(ROOT / "testbed" / "lockstep_testbed", src / "lockstep_testbed", ignore=ignore)
    rules = ROOT / "testbed" / "importlinter.toml"
    command = [str(Path(sys.executable).with_name("lint-imports")), str(rules), "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(src)}

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run(
            command, capture_output=True, text=True, cwd=tmp_path, env=env, check=False
        )

    kept = lint()
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr
    errors = src / "lockstep" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _planted():\n    import lockstep_testbed\n")
    broken = lint()
    assert broken.returncode == 1, broken.stdout[-3000:]
    assert "lockstep is not allowed to import lockstep_testbed" in broken.stdout
    noxfile = (ROOT / "noxfile.py").read_text()
    assert "testbed/importlinter.toml" in noxfile[noxfile.index("def lint(") :]
