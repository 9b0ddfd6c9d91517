"""A newcomer's `pip install lockstep` brings none of the extras: a command that needs one says
which, in one line, exit 2, before any rank starts (`lockstep.extras`).

Each case runs `python -m lockstep` with a sitecustomize on PYTHONPATH that hides packages from
every interpreter it reaches (the launching process, a forkserver, each rank), as if they were
not installed: importing one raises ModuleNotFoundError, as for a real missing package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep import extras

ROOT = Path(__file__).resolve().parents[1]
HIDE = """\
import os, sys
from importlib.abc import MetaPathFinder
HIDDEN = set(os.environ["HIDE_PACKAGES"].split(","))
class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""


def lockstep(tmp_path: Path, hidden: str, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    env = dict(os.environ, HIDE_PACKAGES=hidden, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "lockstep", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, extra: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"pip install 'lockstep[{extra}]'" in lines[0], lines[0]
    return lines[0]


def test_train_without_transformers_names_the_extra_before_any_rank(tmp_path):
    out = tmp_path / "runs"
    proc = lockstep(tmp_path, "transformers", "train", str(ROOT / "smoke/cpu-ddp.toml"),
                    "--nproc", "2", "--out", str(out))  # fmt: skip
    line = one_line(proc, "train")
    assert "transformers (model preset gpt2-tiny)" in line
    assert not out.exists()  # no rank started, nothing written


def test_train_without_wandb_offers_to_turn_it_off(tmp_path):
    proc = lockstep(tmp_path, "wandb", "train", str(ROOT / "smoke/cpu-ddp.toml"))
    assert "logging.wandb = 'disabled'" in one_line(proc, "train")


@pytest.mark.parametrize(
    "args",
    [
        ["check", "determinism", str(ROOT / "smoke/cpu-zero1.toml")],
        ["check", "determinism", "--script", "train.py", "--launcher", "deepspeed"],
        ["ds-config", str(ROOT / "README.md"), "--world-size", "2"],
    ],
    ids=["zero-engine", "deepspeed-launcher", "ds-config"],
)
def test_deepspeed_commands_without_deepspeed(tmp_path, args):
    one_line(lockstep(tmp_path, "deepspeed", *args), "deepspeed")


def test_a_lightning_script_without_lightning_names_the_extra_before_any_rank(tmp_path):
    out = tmp_path / "runs"
    script = ROOT / "examples/train_lightning.py"
    proc = lockstep(tmp_path, "lightning,pytorch_lightning", "check", "all", "--script",
                    str(script), "--out", str(out))  # fmt: skip
    assert "train_lightning.py imports lightning" in one_line(proc, "lightning")
    assert not out.exists()  # no rank started, nothing written


def test_gate_plots_without_matplotlib(tmp_path):
    proc = lockstep(tmp_path, "matplotlib", "gate", "check", "g", "--script", "train.py",
                    "--plot", str(tmp_path / "plots"))  # fmt: skip
    one_line(proc, "plot")


def test_the_extras_named_exist_in_pyproject():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras.EXTRA_OF.values()) <= set(declared)
    for module, extra in extras.EXTRA_OF.items():
        names = {r.split(">")[0].split("=")[0].split("[")[0] for r in declared[extra]}
        distribution = {"pynvml": "nvidia-ml-py", "pytorch_lightning": "lightning"}
        assert distribution.get(module, module) in names, (module, extra)
