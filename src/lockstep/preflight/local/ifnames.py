"""The interfaces NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name must exist here, or the
process group breaks on this node (`Bootstrap : no socket interface found`)."""

from __future__ import annotations

import os
import socket

from lockstep.launch.detect import RankInfo
from lockstep.preflight.local.check import result


def socket_ifnames() -> list[dict[str, str]]:
    """Both checks, those whose variable is set (the node check-in's use)."""
    return [r for r in (nccl_socket_ifname(None, None), gloo_socket_ifname(None, None)) if r]


def nccl_socket_ifname(info: RankInfo | None, torch) -> dict[str, str] | None:
    """NCCL's syntax: comma list of prefixes, `=` for exact names, `^` to exclude."""
    value = os.environ.get("NCCL_SOCKET_IFNAME")
    if not value:
        return None
    present = _present()
    spec = value
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    wanted = [w for w in spec.removeprefix("=").split(",") if w]

    def matches(iface: str) -> bool:
        return any(iface == w if exact else iface.startswith(w) for w in wanted)

    usable = [i for i in present if matches(i) != exclude]
    if not usable:
        return result(
            "nccl_socket_ifname",
            "fail",
            f"NCCL_SOCKET_IFNAME={value} matches no interface (have {', '.join(present)}); "
            "NCCL would stop with 'Bootstrap : no socket interface found'",
        )
    return result("nccl_socket_ifname", "ok", f"NCCL_SOCKET_IFNAME={value} -> {', '.join(usable)}")


def gloo_socket_ifname(info: RankInfo | None, torch) -> dict[str, str] | None:
    gloo = os.environ.get("GLOO_SOCKET_IFNAME")
    if not gloo:
        return None
    present = _present()
    absent = [i for i in gloo.split(",") if i and i not in present]
    status = "fail" if absent else "ok"
    detail = (
        f"GLOO_SOCKET_IFNAME names {', '.join(absent)}, absent here (have {', '.join(present)})"
        if absent
        else f"GLOO_SOCKET_IFNAME={gloo} exists"
    )
    return result("gloo_socket_ifname", status, detail)


def _present() -> list[str]:
    return [iface for _, iface in socket.if_nameindex()]
