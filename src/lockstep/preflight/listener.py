"""Where preflight's own stores listen (node 0's check-in, rank 0's c10d store, the process
group's store): on the address the job rendezvous on, not on every interface. Where that
address cannot serve the other nodes (a host name that resolves to loopback here only, or not
at all), every interface instead, and one warning line on stderr says so and why, once a
process: a listener open to every network the host is on should never be a silent choice."""

from __future__ import annotations

import ipaddress
import socket
import sys

_WARNED: set[str] = set()  # hosts this process warned about already


def listen(host: str, port: int) -> tuple[int, str]:
    """A socket listening on HOST's address (the one the job rendezvous on) at PORT, for the
    TCPStore to serve on (its own listener takes every interface); its descriptor. Where HOST
    does not resolve here, every interface: the check-in then names that as this node's
    problem, and a store nobody can reach by name serves no one else anyway. Where a host
    NAME resolves to loopback here only (Debian's `127.0.1.1 HOSTNAME` line) while other
    hosts resolve it to this node's address, every interface too: binding loopback would shut
    them out (docs/preflight.md: give an address to keep the listener on one interface).
    The descriptor and the address (the server's own client connects there)."""
    why = ""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        if ipaddress.ip_address(address[0]).is_loopback and not names_loopback(host):
            why = f"{host} resolves to loopback ({address[0]}) here"
            family, address = socket.AF_INET, ("0.0.0.0", port)
    except OSError:
        why = f"{host} does not resolve here"
        family, address = socket.AF_INET, ("0.0.0.0", port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    if why:
        _warn(host, sock.getsockname()[1], why)
    return sock.detach(), "127.0.0.1" if address[0] == "0.0.0.0" else address[0]


def names_loopback(host: str) -> bool:
    """HOST is `localhost` or a loopback address written out: the job meant this host only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() in ("localhost", "localhost.localdomain")


def _warn(host: str, port: int, why: str) -> None:
    if host in _WARNED:
        return
    _WARNED.add(host)
    print(
        f"preflight: warning: the store on port {port} listens on every interface, since {why}; "
        "give the rendezvous endpoint (MASTER_ADDR, --rdzv-endpoint) as this host's address to "
        "keep it on one",
        file=sys.stderr,
        flush=True,
    )
