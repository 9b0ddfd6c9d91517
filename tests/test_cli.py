"""The `lockstep` console script: version, help, and one-line errors with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

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


def test_the_command_leaves_without_walking_torchs_heap(tmp_path):
    """`console` (the console script's and `python -m lockstep`'s entry) freezes the heap after
    every other atexit callback: a callback registered before it sees the freeze, and what
    the command wrote is all there."""
    out = tmp_path / "fp.json"
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
        "from lockstep.cli import console\n"
        f"sys.argv[1:] = ['fingerprint', '--json', {str(out)!r}]\n"
        "raise SystemExit(console())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "frozen True"
    assert "torch" in json.loads(out.read_text())["sections"]  # the whole file


def test_both_entry_points_are_the_console():
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="lockstep")
    assert script.value == "lockstep.cli:console"
    main_module = (Path(lockstep.__file__).parent / "__main__.py").read_text()
    assert "raise SystemExit(console())" in main_module
