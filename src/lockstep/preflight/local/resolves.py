"""Names that must resolve: MASTER_ADDR (or no rank meets the others) and this host's own
name (gloo and NCCL take their address from it); the node check-in's endpoint too."""

from __future__ import annotations

import socket

from lockstep.launch.detect import RankInfo
from lockstep.preflight.local.check import result


def resolves(name: str, what: str, host: str) -> dict[str, str]:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as err:
        return result(
            name, "fail", f"{what} {host!r} does not resolve ({err}); fix /etc/hosts or DNS"
        )
    return result(name, "ok", f"{what} {host} resolves")


def master_addr(info: RankInfo, torch) -> dict[str, str]:
    return resolves("master_addr", "MASTER_ADDR", info.master_addr)


def hostname(info: RankInfo, torch) -> dict[str, str]:
    return resolves("hostname", "own hostname", socket.gethostname())
