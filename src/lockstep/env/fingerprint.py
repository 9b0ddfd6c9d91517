"""One rank's environment fingerprint, collected in-process (no subprocess), each section with
its own digest so that ranks compare a few bytes first. Design: docs/design/env.md."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import resource
import shutil
import socket
import sys
from importlib import metadata
from pathlib import Path

from lockstep.env import cuda_stack, image_manifest
from lockstep.env.lockfile import canonicalize_name, compare_lock, find_lock
from lockstep.errors import UsageError
from lockstep.launch.detect import LAUNCHER_VARIABLES
from lockstep.redact import redact_mapping

SCHEMA = 1
SECTIONS = (
    "python",
    "system",
    "torch",
    "gpus",
    "packages",
    "container",
    "env",
    "determinism",
    "resources",
)
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "GLOO_", "OMP_", "MKL_", "CUBLAS_")
ENV_NAMES = ("LD_LIBRARY_PATH", "PYTHONHASHSEED", *LAUNCHER_VARIABLES)
_MAPPED_LIBS = ("libnccl", "libcudnn", "libcudart")


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def collect(lock: Path | None = None, cwd: Path | None = None) -> dict:
    """The full fingerprint: {"schema", "sections", "digests"}."""
    import torch

    cwd = cwd or Path.cwd()
    torch_section = _torch(torch)
    sections = {
        "python": _python(),
        "system": _system(),
        "torch": torch_section,
        "gpus": _gpus(torch),
        "packages": packages_section(lock, cwd, torch.__version__, cuda_stack.built(torch_section)),
        "container": _container(),
        "env": _env(),
        "determinism": _determinism(torch),
        "resources": _resources(cwd),
    }
    return {
        "schema": SCHEMA,
        "sections": sections,
        "digests": {name: digest(body) for name, body in sections.items()},
    }


def resalt(fp: dict) -> None:
    """Redact the env section again under the current salt (the job-wide one, once known)."""
    fp["sections"]["env"] = _env()
    fp["digests"]["env"] = digest(fp["sections"]["env"])


def load(path: Path) -> dict:
    """A saved fingerprint; bad files end with a one-line error."""
    from lockstep.inputs import read_json

    data = read_json(path, "fingerprint")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "sections" not in data:
        raise UsageError(
            f"{path} is not a lockstep fingerprint of schema {SCHEMA}; "
            "make one with `lockstep fingerprint --json PATH`"
        )
    return data


def dump(fingerprint: dict, path: Path) -> None:
    path.write_text(json.dumps(fingerprint, sort_keys=True, indent=2, ensure_ascii=False) + "\n")


def _python() -> dict:
    return {
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "executable": sys.executable,
    }


def _system() -> dict:
    uname = os.uname()
    return {
        "os": _os_release(),
        "kernel": uname.release,
        "machine": uname.machine,
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None,
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "hostname": socket.gethostname(),
    }


def _os_release() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return platform.system()
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
    return match[1] if match else platform.system()


def _cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None
    match = re.search(r"^(?:model name|Model|cpu model)\s*:\s*(.+)$", text, re.MULTILINE)
    return match[1].strip() if match else None


def _torch(torch) -> dict:
    # NCCL's and cuDNN's versions are those of the loaded libraries: no GPU needed
    nccl = cuda_stack.nccl_version(torch)
    return {
        "version": torch.__version__,
        "git_version": torch.version.git_version,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "debug": torch.version.debug,
        "arch_list": torch.cuda.get_arch_list(),
        "nccl": nccl,
        "cudnn": torch.backends.cudnn.version(),
        "distributed_backends": [
            name
            for name, available in (
                ("gloo", torch.distributed.is_gloo_available()),
                ("nccl", torch.distributed.is_nccl_available()),
                ("mpi", torch.distributed.is_mpi_available()),
            )
            if available
        ],
        "mapped_libraries": mapped_libraries(),
    }


def mapped_libraries() -> dict[str, list[str]]:
    """Paths of libnccl, libcudnn and libcudart loaded into this process (/proc/self/maps)."""
    found: dict[str, set[str]] = {name: set() for name in _MAPPED_LIBS}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                base = os.path.basename(path)
                for name in _MAPPED_LIBS:
                    if base.startswith(name + ".") or base.startswith(name + "_"):
                        found[name].add(path)
    except OSError:
        pass
    return {name: sorted(paths) for name, paths in found.items()}


def _gpus(torch) -> dict:
    nvml = _gpus_nvml(torch)
    if nvml is not None:
        return nvml
    if not torch.cuda.is_available():
        return {"source": "none", "driver": None, "devices": []}
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            _device(
                torch,
                index,
                props.name,
                _uuid(str(getattr(props, "uuid", ""))),
                getattr(props, "pci_bus_id", None),
                (props.major, props.minor),
                props.total_memory // (1 << 20),
            )
        )
    return {"source": "torch.cuda", "driver": None, "devices": devices}


def _gpus_nvml(torch) -> dict | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or no driver: NVML is simply not there
        return None
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            devices.append(
                _device(
                    torch,
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    _uuid(_text(pynvml.nvmlDeviceGetUUID(handle))),
                    _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                    pynvml.nvmlDeviceGetCudaComputeCapability(handle),
                    pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20),
                )
            )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return {
        "source": "nvml",
        "driver": driver,
        "driver_cuda": f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}",
        "devices": devices,
    }


def _device(torch, index, name, uuid, pci_bus_id, capability, memory_mib) -> dict:
    major, minor = capability
    return {
        "index": index,
        "name": name,
        "uuid": uuid,
        "pci_bus_id": pci_bus_id,
        "compute_capability": f"{major}.{minor}",
        "memory_mib": memory_mib,
        "capability_in_arch_list": _in_arch_list(torch.cuda.get_arch_list(), major, minor),
    }


def _in_arch_list(arch_list: list[str], major: int, minor: int) -> bool:
    """A binary for sm_XY, or PTX (compute_AB, AB <= XY) the driver can JIT for it."""
    cc = major * 10 + minor
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = int(re.sub(r"\D", "", number) or -1)
        if (kind == "sm" and digits == cc) or (kind == "compute" and digits <= cc):
            return True
    return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _uuid(value: str) -> str | None:
    return value.removeprefix("GPU-") or None


def packages_section(
    lock: Path | None, cwd: Path, torch_version: str, stack: dict | None = None
) -> dict:
    """The `packages` section: installed distributions, and the lock compared with them (and
    with `stack`, torch's CUDA, cuDNN and NCCL: cuda_stack.built)."""
    installed: dict[str, str] = {}
    shadowed: dict[str, list[str]] = {}
    editable: dict[str, str | None] = {}
    vcs: dict[str, str | None] = {}
    records: dict[str, str] = {}
    for dist in metadata.distributions():
        name, version = _name_version(dist)
        if not name:
            continue
        if name in installed:  # a later sys.path entry; imports see the first one
            if version != installed[name]:
                shadowed.setdefault(name, []).append(version)
            continue
        installed[name] = version
        records[name] = hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest()
        direct = _direct_url(dist)
        if direct.get("dir_info", {}).get("editable"):
            editable[name] = vcs_revision(direct.get("url", ""))
        elif "vcs_info" in direct:  # pip install git+https://...: pip recorded the commit
            vcs[name] = direct["vcs_info"].get("commit_id")
    lock = lock or find_lock(cwd, torch_version)
    return {
        "count": len(installed),
        "digest": digest(sorted(f"{n}=={installed[n]} {records[n]}" for n in installed)),
        "installed": dict(sorted(installed.items())),
        "editable": editable,
        "vcs": vcs,
        "shadowed": shadowed,
        "lock": compare_lock(lock, installed, stack) if lock else None,
    }


def _name_version(dist: metadata.Distribution) -> tuple[str, str]:
    """Name and version from the metadata headers alone (`dist.metadata` parses the whole
    long description with the email parser, 10x slower)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    headers = dict(
        line.split(": ", 1) for line in text.partition("\n\n")[0].splitlines() if ": " in line
    )
    return canonicalize_name(headers.get("Name", "")), headers.get("Version", "")


def _direct_url(dist: metadata.Distribution) -> dict:
    text = dist.read_text("direct_url.json")
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def vcs_revision(url: str) -> str | None:
    """The git commit checked out at an editable install's source (read from .git, no git)."""
    if not url.startswith("file://"):
        return None
    git = Path(url.removeprefix("file://")) / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <path>", absolute or relative
            git = git.parent / git.read_text().split(":", 1)[1].strip()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None


def _container() -> dict:
    markers = [p for p in ("/.dockerenv", "/run/.containerenv") if os.path.exists(p)]
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        cgroup = ""
    runtime = next(
        (
            name
            for name, found in (
                ("docker", "/.dockerenv" in markers or "docker" in cgroup),
                ("podman", "/run/.containerenv" in markers or "libpod" in cgroup),
                ("kubernetes", "kubepods" in cgroup),
                ("containerd", "containerd" in cgroup),
                ("lxc", "lxc" in cgroup),
            )
            if found
        ),
        None,
    )
    manifest = image_manifest.read()
    return {
        "in_container": runtime is not None,
        "runtime": runtime,
        "image": manifest.get("image", "unknown") if manifest else "unknown",
        "image_identity": digest(manifest) if manifest else "unknown",
        "manifest": manifest,
    }


def _env() -> dict:
    chosen = {
        name: value
        for name, value in os.environ.items()
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES
    }
    return redact_mapping(dict(sorted(chosen.items())))


def _determinism(torch) -> dict:
    return {
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        # The vector ISA torch's CPU kernels dispatch to: CPU results differ across it.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def shm_bytes() -> int | None:
    """The size of /dev/shm (None where there is none); `lockstep.env.shm.check` judges it."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _resources(cwd: Path) -> dict:
    shm = shm_bytes()
    return {
        # Whole GiB: byte counts of identical nodes differ by firmware reservations.
        "shm_gib": round(shm / (1 << 30)) if shm is not None else None,
        "memory_total_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
        ),
        "memlock": _limit(resource.RLIMIT_MEMLOCK),
        "nofile": _limit(resource.RLIMIT_NOFILE),
        "disk_free_bytes": shutil.disk_usage(cwd).free,
    }


def _limit(which: int) -> dict:
    soft, hard = resource.getrlimit(which)

    def show(value: int) -> int | str:
        return "unlimited" if value == resource.RLIM_INFINITY else value

    return {"soft": show(soft), "hard": show(hard)}
