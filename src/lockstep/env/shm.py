"""The /dev/shm check that `lockstep fingerprint` and preflight's local checks both report."""

from __future__ import annotations

from lockstep.env.fingerprint import shm_bytes

SHM_WARN_BYTES = 1 << 30


def check() -> dict[str, str]:
    """{"name": "shm", "status": ok or warn, "detail"}: NCCL's shared-memory transport needs
    1 GiB or more."""
    size = shm_bytes()
    if size is None:
        return _result("warn", "no /dev/shm: NCCL's shared-memory transport cannot work")
    if size < SHM_WARN_BYTES:
        return _result(
            "warn",
            f"/dev/shm is {size >> 20} MiB (< 1 GiB): NCCL fails with 'No space left on "
            "device'; run the container with --shm-size=16g or --ipc=host",
        )
    return _result("ok", f"/dev/shm {size / (1 << 30):.1f} GiB")


def _result(status: str, detail: str) -> dict[str, str]:
    return {"name": "shm", "status": status, "detail": detail}
