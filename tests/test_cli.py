"""The `lockstep` console script: version, help, and one-line errors with exit code 2."""

import subprocess
import sys

import lockstep
from lockstep.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lockstep", *args], capture_output=True, text=True, timeout=60
    )


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"lockstep {lockstep.__version__}"


def test_help_lists_subcommands():
    out = run_cli("--help")
    assert out.returncode == 0
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("    ")}
    commands = {"fingerprint", "diff", "preflight", "train", "ds-config", "check", "gate"}
    assert commands <= listed, f"missing from --help: {sorted(commands - listed)}"


def test_unknown_subcommand_is_one_line_exit_2():
    out = run_cli("no-such-command")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: lockstep" in capsys.readouterr().out


def test_deepspeed_launcher_local_rank_argument_becomes_local_rank(monkeypatch):
    import os

    from lockstep.cli import take_local_rank

    monkeypatch.setenv("LOCAL_RANK", "")  # so that monkeypatch unsets it again afterwards
    monkeypatch.delenv("LOCAL_RANK")
    assert take_local_rank(["--local_rank=3", "preflight", "--nproc", "2"]) == [
        "preflight",
        "--nproc",
        "2",
    ]
    assert os.environ["LOCAL_RANK"] == "3"
    monkeypatch.delenv("LOCAL_RANK")
    assert take_local_rank(["fingerprint", "--local-rank", "1"]) == ["fingerprint"]
    assert os.environ["LOCAL_RANK"] == "1"
