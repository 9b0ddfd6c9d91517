"""Bad input is one line and exit 2, never a traceback, never a loop (issue #37): each case runs
the real command in-process on a crafted file or flag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lockstep.gate.ab import TMP_PREFIX, prune_orphans
from support.inprocess import assert_one_error_line, run_main

ROOT = Path(__file__).resolve().parents[1]
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    (d / "deep.json").write_text(DEEP)
    (d / "deep.jsonl").write_text('{"step": 1, "loss": ' + DEEP + "}\n")
    (d / "digits.jsonl").write_text('{"step": 1, "loss": ' + "9" * 5000 + "}\n")
    (d / "binary").write_bytes(bytes(range(256)) * 8)
    (d / "folder").mkdir()
    for name, ds in {
        "ds-zero5": {"train_batch_size": 8, "zero_optimization": 5},
        "ds-text": {"train_batch_size": "x"},
        "ds-micro0": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0},
        "ds-ok": {"train_batch_size": 8},
    }.items():
        (d / f"{name}.json").write_text(json.dumps(ds))
    (d / "ds-huge.json").write_text('{"train_batch_size": 1e400}')
    shutil.copy(ROOT / "smoke" / "cpu-ddp.toml", d / "run.toml")
    # tomllib recurses into arrays and inline tables; dotted keys nest without recursing
    (d / "deep-array.toml").write_text("[model]\nx = " + DEEP + "\n")
    (d / "deep-table.toml").write_text("x = " + "{a = " * 5_000 + "1" + "}" * 5_000 + "\n")
    (d / "deep-dotted.toml").write_text("[model." + ".".join(["a"] * 5_000) + "]\n")
    return d


CASES = {
    "diff of deep JSON": (["diff", "deep.json", "deep.json"], "nested too deep"),
    "ds-config of deep JSON": (["ds-config", "deep.json", "--world-size", "2"], "nested too deep"),
    "golden of deep JSON": (["gate", "compare", "deep.json", "digits.jsonl"], "nested too deep"),
    "metrics of deep JSON": (["gate", "alerts", "default", "deep.jsonl"], "nested too deep"),
    "a 5000-digit metric": (["gate", "alerts", "default", "digits.jsonl"], "digits"),
    "a binary lock": (["fingerprint", "--lock", "binary"], "not UTF-8 text"),
    "a binary config": (["train", "binary"], "not UTF-8 text"),
    "binary alert rules": (["gate", "alerts", "binary", "digits.jsonl"], "not UTF-8 text"),
    "--json at a folder": (["fingerprint", "--json", "folder"], "it is a folder"),
    "preflight --json at a folder": (["preflight", "--json", "folder"], "it is a folder"),
    "check --json at a folder": (["check", "determinism", "run.toml", "--json", "folder"],
                                 "it is a folder"),
    "gate --junit at a folder": (["gate", "check", "x", "run.toml", "--junit", "folder"],
                                 "it is a folder"),
    "gate alerts --json at a folder": (["gate", "alerts", "default", "digits.jsonl", "--json",
                                        "folder"], "it is a folder"),
    "ds-config --world-size 0": (["ds-config", "ds-ok.json", "--world-size", "0"], "at least 1"),
    "preflight --timeout nan": (["preflight", "--timeout", "nan"], "positive finite"),
    "preflight --timeout inf": (["preflight", "--timeout", "inf"], "positive finite"),
    "preflight --timeout 1e300": (["preflight", "--timeout", "1e300"], "a week"),
    "check --timeout -1": (["check", "determinism", "run.toml", "--timeout", "-1"], "positive"),
    "gate record --repeats 0": (["gate", "record", "x", "run.toml", "--repeats", "0"],
                                "at least 1"),
    "a run config of deep TOML": (["train", "deep-array.toml", "--nproc", "2"], "nested too deep"),
    "a checked config of deep TOML": (["check", "determinism", "deep-table.toml", "--nproc", "2"],
                                      "nested too deep"),
    "a gated config of deep TOML": (["gate", "check", "x", "deep-array.toml"], "nested too deep"),
    "a config of deep dotted keys": (["train", "deep-dotted.toml"], "nested too deep"),
    "alert rules of deep TOML": (["gate", "alerts", "deep-table.toml", "digits.jsonl"],
                                 "nested too deep"),
    "--set of a deep TOML value": (["train", "run.toml", "--set", "model.x=" + DEEP],
                                   "--set model.x: nested too deep"),
    "--set of a deep dotted key": (["train", "run.toml", "--set", "model." + "a." * 5_000 + "b=1"],
                                   "nested too deep"),
    "a micro batch of 1e23": (["train", "run.toml", "--set", f"batch.micro_size={10**23}"],
                              "less than or equal to"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(files, case):
    argv, said = CASES[case]
    assert_one_error_line(run_main(argv, files), said)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("ds-zero5", "zero_optimization must be a JSON object, got 5"),
        ("ds-text", 'train_batch_size must be a positive integer or "auto", got "x"'),
        ("ds-huge", 'train_batch_size must be a positive integer or "auto", got Infinity'),
        ("ds-micro0", "train_micro_batch_size_per_gpu must be a positive integer"),
    ],
)
def test_ds_config_refuses_values_of_the_wrong_type(files, name, said):
    result = run_main(["ds-config", f"{name}.json", "--world-size", "2"], files)
    assert result.returncode == 1 and said in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_preflight_plot_without_matplotlib_is_refused_before_any_rank(files):
    """A real missing module: the interpreter's finder refuses matplotlib."""
    code = (
        "import sys, importlib.abc\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'matplotlib': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from lockstep.cli import main\n"
        "sys.exit(main(['preflight', '--nproc', '1', '--plot', 'plots']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=files, capture_output=True,
                            text=True, check=False, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "PASS" not in result.stdout and "Traceback" not in result.stderr
    assert "lockstep[plot]" in result.stderr


def test_gate_ab_prunes_what_a_killed_run_left(tmp_path):
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "-C", str(repo), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "x"], check=True)
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is gone: the owner of the orphan below
    orphan = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dead.pid}-"))
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach",
                    str(orphan / "base"), "HEAD"], check=True)  # fmt: skip
    mine = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))  # a live run's
    try:
        prune_orphans(repo)
        listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                                text=True, check=True).stdout  # fmt: skip
        assert not orphan.exists() and str(orphan) not in listed
        assert mine.exists()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(orphan, ignore_errors=True)
