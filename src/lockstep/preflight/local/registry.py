"""Every local check, in the order the report lists them: a new check is a module of
`lockstep.preflight.local` and a row of `LOCAL_CHECKS`, or `register()` from outside (in every
rank's process: each rank runs the checks it knows)."""

from __future__ import annotations

from lockstep.launch.detect import RankInfo
from lockstep.preflight.lines import first_line
from lockstep.preflight.local import driver, gpu, ifnames, resolves, shm
from lockstep.preflight.local.check import LocalCheck, result
from lockstep.registry import Registry

LOCAL_CHECKS: Registry[LocalCheck] = Registry(
    "local check",
    [
        LocalCheck("gpu_assignment", gpu.gpu_assignment),
        LocalCheck(driver.NAME, driver.nvidia_driver, blocks=("nccl",)),
        LocalCheck("master_addr", resolves.master_addr, fatal=True),
        LocalCheck("hostname", resolves.hostname, blocks=("gloo", "nccl")),
        LocalCheck("nccl_socket_ifname", ifnames.nccl_socket_ifname, blocks=("nccl",)),
        LocalCheck("gloo_socket_ifname", ifnames.gloo_socket_ifname, blocks=("gloo",)),
        LocalCheck("shm", shm.shm),
    ],
)
register = LOCAL_CHECKS.register


def run_all(info: RankInfo, torch) -> list[dict[str, str]]:
    """Every check's result on this rank; a check that raises is a failure that says so."""
    out = []
    for check in LOCAL_CHECKS.values():
        try:
            found = check.run(info, torch)
        except Exception as err:  # a registered check's bug must not hang the others
            found = result(check.name, "fail", f"the check raised: {first_line(err)}")
        if found is not None:
            out.append(found)
    return out


def blocking(backend: str) -> tuple[str, ...]:
    """The checks whose failure breaks `backend`'s process group on that node."""
    return tuple(c.name for c in LOCAL_CHECKS.values() if backend in c.blocks)


def fatal() -> tuple[str, ...]:
    """The checks whose failure leaves a rank no way to meet its peers."""
    return tuple(c.name for c in LOCAL_CHECKS.values() if c.fatal)
