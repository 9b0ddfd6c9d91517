"""The job key's input, through `lockstep preflight`: a key that is set but blank (the variable,
or the file) is refused with one line, exit 2, before any rank starts, never run
UNAUTHENTICATED; the key file must be a regular file of this user's that no one else can read,
opened once (a swap after the check changes nothing); the key's text is scrubbed by any
lockstep process whose environment names it, loaded or not. On the code before, a blank key ran
UNAUTHENTICATED (or, with `--nproc`, with a key made up in its place) with exit 0, a file of
another user's was believed, a FIFO planted as the file hung the launch, and a key file's text
was scrubbed only in the process that had loaded it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.launch import free_port
from lockstep.preflight import job_key
from support.inprocess import run_main
from support.preflight_ranks import LAUNCH_TIMEOUT_S, ForkedRank, base_env

KEY = "5a" * 32
ERROR = "lockstep: error: preflight: "


def one_line(text: str) -> bool:
    return "Traceback" not in text and len(text.strip().splitlines()) == 1


def key_file(tmp_path: Path, text: str = KEY, mode: int = 0o600) -> Path:
    path = tmp_path / "job.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def refused(tmp_path: Path, env: dict[str, str], *args: str) -> str:
    """`lockstep preflight --nproc 2 ARGS` (the ranks it would start get a key made here when
    the operator set none): exit 2, one line on stderr, which is returned."""
    got = run_main(["preflight", "--nproc", "2", *args], tmp_path, environ=base_env(**env))
    assert got.returncode == 2, (got.returncode, got.stdout[-2000:], got.stderr[-2000:])
    assert one_line(got.stderr), got.stderr
    assert KEY not in got.stdout + got.stderr
    return got.stderr.strip()


@pytest.mark.parametrize("blank", ["", "   ", " \n\t "])
def test_a_blank_key_variable_is_refused(tmp_path, blank):
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY": blank})
    assert line.startswith(f"{ERROR}LOCKSTEP_JOB_KEY is set but blank: give every host"), line


def test_a_blank_key_under_a_launcher_is_refused_not_run_unauthenticated(tmp_path):
    """The issue's case: one rank under a launcher (where no key is made) with the variable set
    to nothing ran UNAUTHENTICATED, exit 0; with `--require-key` it said "no job key is set"."""
    env = base_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["LOCKSTEP_JOB_KEY"] = ""
    for args in (["--no-links"], ["--no-links", "--require-key"]):
        rank = ForkedRank(args, env, tmp_path)
        out, err = rank.communicate(timeout=LAUNCH_TIMEOUT_S)
        assert rank.returncode == 2 and one_line(err), (rank.returncode, out, err)
        assert "UNAUTHENTICATED" not in out
        assert err.startswith(f"{ERROR}LOCKSTEP_JOB_KEY is set but blank"), err


@pytest.mark.parametrize("text", ["", "\n", "  \n \n"])
def test_an_empty_key_file_is_refused(tmp_path, text):
    path = key_file(tmp_path, text)
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY_FILE": str(path)}, "--require-key")
    assert line == (
        f"{ERROR}LOCKSTEP_JOB_KEY_FILE={path} holds no key (the file is empty or blank): write "
        f"one there (`umask 077 && openssl rand -hex 32 > {path}`)"
    )


def test_a_key_file_variable_that_names_nothing_is_refused(tmp_path):
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY_FILE": " "})
    assert line.startswith(f"{ERROR}LOCKSTEP_JOB_KEY_FILE is set but empty: give every host")


def test_a_key_file_of_another_users_is_refused(tmp_path, monkeypatch):
    """Another user could have written the key (or read it: it is theirs to change later)."""
    path = key_file(tmp_path)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        owner = 65534
    else:  # a file of another user's cannot be made here: this process's uid changes instead
        owner = os.geteuid()
        monkeypatch.setattr(job_key.os, "geteuid", lambda: owner + 1)
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY_FILE": str(path)})
    assert line.startswith(
        f"{ERROR}LOCKSTEP_JOB_KEY_FILE={path} is owned by uid {owner}, not by this user"
    ), line


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_key_file_group_or_others_can_reach_is_refused(tmp_path, mode):
    path = key_file(tmp_path, mode=mode)
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY_FILE": str(path)})
    assert f"{path} is open to group or others (mode {mode:o}); run `chmod 600" in line, line


def test_a_fifo_planted_as_the_key_file_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO for reading waits for a writer: the launch hung for ever."""
    fifo = tmp_path / "job.key"
    os.mkfifo(fifo, 0o600)
    env = base_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    env["LOCKSTEP_JOB_KEY_FILE"] = str(fifo)
    rank = ForkedRank(["--no-links"], env, tmp_path)
    try:
        out, err = rank.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        rank.kill()
        raise AssertionError("preflight waited on the FIFO named as its key file") from None
    assert rank.returncode == 2 and one_line(err), (rank.returncode, out, err)
    assert f"LOCKSTEP_JOB_KEY_FILE={fifo} is not a regular file" in err


def test_the_key_file_is_opened_once_so_a_swap_after_the_check_changes_nothing(
    tmp_path, monkeypatch
):
    """Whatever first looks at the file (a stat, an open), the path then becomes a link to a
    file that others can write, holding another key. The key read is the file checked."""
    path = key_file(tmp_path)
    planted = tmp_path / "planted"
    planted.write_text("9" * 64)
    planted.chmod(0o666)
    swapped: list[str] = []

    def swap_after(real):
        def call(name, *args, **kwargs):
            result = real(name, *args, **kwargs)
            mine = isinstance(name, (str, os.PathLike)) and os.fspath(name) == str(path)
            if mine and not swapped:
                swapped.append(real.__name__)
                link = tmp_path / "link"
                link.symlink_to(planted)
                os.replace(link, path)
            return result

        return call

    monkeypatch.setattr(os, "stat", swap_after(os.stat))
    monkeypatch.setattr(os, "open", swap_after(os.open))
    got = job_key.load({"LOCKSTEP_JOB_KEY_FILE": str(path)})
    assert swapped, "the key file was never looked at"
    assert path.is_symlink()
    assert got == KEY.encode(), f"read the planted file after the check ({swapped[0]})"


def test_a_link_to_a_file_of_ones_own_is_followed_and_its_target_checked(tmp_path):
    """A Kubernetes Secret mounted as a file is a symbolic link (`..data/KEY`): followed, and
    the file it leads to is the one checked."""
    target = key_file(tmp_path)
    link = tmp_path / "secret"
    link.symlink_to(target)
    assert job_key.load({"LOCKSTEP_JOB_KEY_FILE": str(link)}) == KEY.encode()
    target.chmod(0o644)
    line = refused(tmp_path, {"LOCKSTEP_JOB_KEY_FILE": str(link)})
    assert f"{link} is open to group or others (mode 644)" in line


SCRUB = "import sys; from lockstep.redact import scrub_text; print(scrub_text(sys.argv[1]))"


@pytest.mark.parametrize("source", ["variable", "file"])
def test_a_process_that_never_loaded_the_key_scrubs_it(tmp_path, source):
    """A lockstep process of the job's (a report writer, a training step's logger) that has
    the key's variable in its environment but never called `job_key.load` keeps it out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_JOB_KEY")}
    if source == "variable":
        env["LOCKSTEP_JOB_KEY"] = KEY
    else:
        env["LOCKSTEP_JOB_KEY_FILE"] = str(key_file(tmp_path, KEY + "\n"))
    got = subprocess.run(
        [sys.executable, "-c", SCRUB, f"the store answered {KEY}."],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert KEY not in got.stdout and "the store answered <redacted:" in got.stdout, got.stdout
