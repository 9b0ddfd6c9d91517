"""docker/lock-parts.py and docker/deepspeed-build.env: the one source of how a lock is installed
in parts and of DeepSpeed's build switches, for the images (install-lock.sh) and the nox venvs
(noxfile.py). Run for real on the project's locks, copied into tmp folders, and on broken ones.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "lock-parts.py"
LOCKS = ("cpu", "cuda")
NAME = re.compile(r"^([a-z0-9][a-z0-9_.-]*)==", flags=re.M)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def noxfile():
    sys.path.insert(0, str(ROOT))
    try:
        import noxfile
    finally:
        sys.path.remove(str(ROOT))
    return noxfile


@pytest.fixture(params=LOCKS)
def lock(request, tmp_path) -> Path:
    copy = tmp_path / f"{request.param}.txt"
    copy.write_bytes((ROOT / "requirements" / f"{request.param}.txt").read_bytes())
    return copy


def test_parts_hold_each_pin_once_with_its_hashes(lock):
    text = lock.read_text()
    parts = {}
    for name in ("build-tools", "torch", "without-sdist", "sdist"):
        result = run(str(lock), name)
        assert result.returncode == 0, result.stderr
        parts[name] = result.stdout
        for block in re.split(r"\n(?=\S)", result.stdout.strip()):
            assert block + "\n" in text and "--hash=sha256:" in block
    names = {part: NAME.findall(out) for part, out in parts.items()}
    assert names["build-tools"] == ["pip", "setuptools", "wheel"]
    assert names["torch"] == ["torch"] and names["sdist"] == ["deepspeed"]
    every = NAME.findall(text)
    assert sorted(names["without-sdist"] + names["sdist"]) == sorted(every)
    assert len(every) == len(set(every))


def test_a_part_the_lock_lacks_or_a_broken_lock_is_one_line_exit_2(lock, tmp_path):
    text = lock.read_text()
    no_deepspeed = tmp_path / "no-deepspeed.txt"
    no_deepspeed.write_text(re.sub(r"^deepspeed==.*\n(?:\s.*\n)*", "", text, flags=re.M))
    for args, why in (
        ((str(no_deepspeed), "sdist"), "deepspeed not pinned"),
        ((str(no_deepspeed), "without-sdist"), "deepspeed not pinned"),
        ((str(lock), "numpy"), "no part 'numpy'"),
        ((str(tmp_path / "absent.txt"), "torch"), "absent.txt"),
        ((str(lock),), "usage:"),
    ):
        result = run(*args)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("lock-parts: error:") and why in result.stderr
        assert len(result.stderr.splitlines()) == 1
    for bad, why in (
        ("-e file:.\n", "not a `name==version` pin"),
        ("    --hash=sha256:" + "0" * 64 + "\n", "indented line before any pin"),
        (text + text[text.index("torch==") :], "torch is pinned twice"),
    ):
        broken = tmp_path / "broken.txt"
        broken.write_text(bad + text if "twice" not in why else bad)
        result = run(str(broken), "torch")
        assert result.returncode == 2 and why in result.stderr, result.stderr


def test_switches_file_is_strict_key_value(tmp_path):
    result = run("--switches", str(ROOT / "docker" / "deepspeed-build.env"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "DS_ACCELERATOR=cpu",
        "DS_BUILD_OPS=0",
        "DS_BUILD_SHM_COMM=1",
        "DS_ENABLE_NINJA=1",
        "CFLAGS=-g0",
    ]
    for line in (
        'CFLAGS="-g0 -O2"',
        "export DS_BUILD_OPS=0",
        "DS_BUILD_OPS=$(id)",
        "ds_build_ops=0",
        "DS_BUILD_OPS = 0",
        "DS_BUILD_OPS=0\nDS_BUILD_OPS=1",
    ):
        env = tmp_path / "switches.env"
        env.write_text("# a comment\n\n" + line + "\n")
        result = run("--switches", str(env))
        assert result.returncode == 2 and result.stdout == "", line
        assert result.stderr.startswith("lock-parts: error: switches.env:"), result.stderr


def test_noxfile_reads_the_same_parts_and_switches(lock):
    nox = noxfile()
    name = lock.stem
    for part in ("build-tools", "without-sdist", "sdist"):
        assert nox.lock_part(name, part).read_text() == run(str(lock), part).stdout
    env = run("--switches", str(ROOT / "docker" / "deepspeed-build.env")).stdout
    expected = dict(line.split("=", 1) for line in env.splitlines()) if name == "cpu" else {}
    assert nox.deepspeed_build_env(name) == expected
    # the order is part of the venv's digest: a reordered file re-makes no venv needlessly
    assert list(nox.deepspeed_build_env(name)) == list(expected)
    assert nox.sdist_flags(expected) == (
        ["--no-cache-dir", "--force-reinstall"] if expected else []
    )


def test_lint_tools_are_in_the_cpu_lock_with_hashes():
    nox = noxfile()
    subset = nox.lock_subset(nox.LINT_TOOLS).read_text()
    assert sorted(NAME.findall(subset)) == sorted(nox.LINT_TOOLS)
    with pytest.raises(SystemExit, match=r"not-a-package not pinned.*nox -s lock"):
        nox.lock_subset(["ruff", "not-a-package"])
