"""Runs that cannot be judged end fast and say why: a reused `--out` never resumes an earlier
check's checkpoints, a run that logs no step is killed at the first-step deadline (exit 3,
"no step logged", the last lines of its log, no rank left), and `check --help` states each
check's real default tolerance (from the registry).

One rank, forked from a process that imported torch (`--run-path`) where a script needs torch;
the environment variable's case runs a script without torch in a new interpreter, the other
way a rank is started and killed."""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from lockstep.checks import registry
from lockstep.cli import build_parser
from lockstep.errors import UsageError
from lockstep.job_options import FIRST_STEP_ENV, FIRST_STEP_TIMEOUT_S, first_step_default
from support.inprocess import run_main
from support.script_check import EXAMPLE, error_lines

# The example with a checkpoint file per step, resumed from the latest, as the HF Trainer's
# `checkpoint-N` folders are: an earlier check's later checkpoint would be the latest.
PER_STEP = [
    (
        "if proto.resume and ckpt and ckpt.exists():\n    state = torch.load(ckpt,",
        "saved = sorted(ckpt.parent.glob('state-*.pt'), key=lambda p: int(p.stem[6:])) "
        "if ckpt else []\nif proto.resume and saved:\n    state = torch.load(saved[-1],",
    ),
    (".replace(ckpt)\n", '.replace(ckpt.with_name(f"state-{step}.pt"))\n'),
]


def per_step_example(tmp_path: Path) -> Path:
    source = EXAMPLE.read_text()
    for old, new in PER_STEP:
        assert source.count(old) == 1, f"the example no longer contains {old!r}"
        source = source.replace(old, new)
    path = tmp_path / "train_per_step.py"
    path.write_text(source)
    return path


def test_a_reused_out_starts_afresh_and_keeps_the_users_files(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["check", "resume", "--script", str(per_step_example(tmp_path)), "--nproc", "1",
            "--steps", "4", "--run-path", "--out", str(out)]  # fmt: skip
    first = run_main(argv, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    # the second check's first half writes state-2.pt beside the first check's state-4.pt
    second = run_main(argv, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "PASS resume: steps 3..4 after a resume at step 2" in second.stdout
    assert f"removed the runs an earlier check left in {out}" in second.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (out / "resume-checkpoints").iterdir()) == [
        "state-2.pt",
        "state-4.pt",
    ]


SILENT = """\
import os, time
{imports}
print("loading the shards of my-model", flush=True)
open({pid!r}, "w").write(str(os.getpid()))
time.sleep(600)
"""


def silent_script(tmp_path: Path, imports: str) -> Path:
    path = tmp_path / "silent.py"
    path.write_text(SILENT.format(imports=imports, pid=str(tmp_path / "pid")))
    return path


def assert_killed_naming_no_step(proc, took: float, deadline: int, tmp_path: Path) -> None:
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert took < deadline + 20, took  # the deadline, the dumps asked for (5 s at most), a kill
    (line,) = error_lines(proc.stderr)
    said = f"run 'determinism-1' (1 ranks): no step logged by rank 0 within {deadline} s"
    assert f"{said} (--first-step-timeout" in line
    assert "log ends: loading the shards of my-model" in line  # the script's own last line
    assert "flight recorder" not in line.split("no step logged")[0]  # the reason comes first
    assert "waiting for the first step" in proc.stderr  # the progress while it waited
    assert not psutil.pid_exists(int((tmp_path / "pid").read_text()))  # the rank is gone


def test_a_silent_run_is_killed_at_the_first_step_deadline(tmp_path):
    script = silent_script(
        tmp_path, "import torch.distributed\ntorch.distributed.init_process_group()"
    )
    argv = ["check", "determinism", "--script", str(script), "--nproc", "1", "--run-path",
            "--first-step-timeout", "5", "--out", str(tmp_path / "runs")]  # fmt: skip
    started = time.monotonic()
    proc = run_main(argv, tmp_path)
    took = time.monotonic() - started
    assert_killed_naming_no_step(proc, took, 5, tmp_path)
    assert f"or {FIRST_STEP_ENV})" in proc.stderr


def test_the_deadline_comes_from_the_environment_where_no_flag_gives_one(tmp_path, monkeypatch):
    script = silent_script(tmp_path, "")  # no torch: a new interpreter starts in milliseconds
    argv = ["check", "determinism", "--script", str(script), "--nproc", "1",
            "--out", str(tmp_path / "runs")]  # fmt: skip
    started = time.monotonic()
    proc = run_main(argv, tmp_path, {FIRST_STEP_ENV: "3"})
    assert_killed_naming_no_step(proc, time.monotonic() - started, 3, tmp_path)

    monkeypatch.delenv(FIRST_STEP_ENV, raising=False)
    assert first_step_default() == FIRST_STEP_TIMEOUT_S
    monkeypatch.setenv(FIRST_STEP_ENV, "soon")
    with pytest.raises(UsageError, match=f"^{FIRST_STEP_ENV}='soon': not a number of seconds$"):
        first_step_default()


def test_the_help_states_each_checks_default_tolerance_from_the_registry(monkeypatch):
    def option_help(option: str) -> str:
        (check,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
        (action,) = [a for a in check.choices["check"]._actions if option in a.option_strings]
        return action.help

    for option, index in (("--rtol", 0), ("--atol", 1)):
        for name in registry.names(script=True):
            tolerance = registry.CHECKS[name].script.tolerance
            if tolerance is None:
                assert f"{name} always compares exactly" in option_help(option)
            else:
                said = re.search(rf"(\S+) for [a-z, -]*\b{name}\b", option_help(option))
                assert said and float(said[1]) == tolerance[index], (name, option_help(option))
    assert "1e-4" not in option_help("--rtol")  # what it used to say world-size defaults to

    # the help is the registry's: another default there is another help
    world = registry.CHECKS["world-size"]
    looser = replace(world.script, tolerance=(1e-5, 0.0))
    monkeypatch.setitem(registry.CHECKS, "world-size", replace(world, script=looser))
    assert "0 for determinism, resume; 1e-05 for world-size; replicas always compares exactly" in (
        option_help("--rtol")
    )
