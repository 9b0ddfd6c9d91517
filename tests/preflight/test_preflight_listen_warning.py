"""A store of preflight's that listens on every interface says so: one warning line on stderr,
once a process, naming the port and why (a host name that resolves to loopback here only, or
not at all). Before, the listener silently took every interface."""

from __future__ import annotations

import socket

import pytest

from lockstep.launch import free_port
from lockstep.preflight import pg_store
from lockstep.preflight.store import connect
from support.preflight_ranks import LAUNCH_TIMEOUT_S, ForkedRank, base_env

KEY = "3e" * 32
WARNING = "preflight: warning: the store on port"
MESSAGES = {"unreachable": "-", "cannot_serve": "-", "name": "-"}


def warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "listens on every interface" in line]


def test_a_name_that_resolves_to_loopback_warns_once_for_both_stores(monkeypatch, capfd):
    """Rank 0 under srun serves lockstep's store and the process group's, both on MASTER_ADDR:
    a name that resolves to loopback here only (Debian's `127.0.1.1 HOSTNAME`) puts both on
    every interface, and one line says so."""
    name = "ls-loopback-only"
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        if host == name:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    port = free_port()
    store = connect(name, port, serve=True, timeout_s=5, reach_s=1, messages=MESSAGES)
    group, _ = pg_store.serve(name, 5)
    try:
        socket.create_connection(("127.0.0.2", port), timeout=2).close()  # every interface
    finally:
        del store, group
    lines = warnings(capfd.readouterr().err)
    assert lines == [
        f"{WARNING} {port} listens on every interface, since {name} resolves to loopback "
        "(127.0.1.1) here; give the rendezvous endpoint (MASTER_ADDR, --rdzv-endpoint) as this "
        "host's address to keep it on one"
    ], lines


def test_an_address_or_localhost_listens_on_one_interface_and_says_nothing(capfd):
    for host in ("127.0.0.1", "localhost"):
        store = connect(host, free_port(), serve=True, timeout_s=5, reach_s=1, messages=MESSAGES)
        del store
    assert warnings(capfd.readouterr().err) == []


def test_preflight_under_a_launcher_warns_in_one_line(tmp_path):
    """One rank under a launcher with MASTER_ADDR this host's own name, where it resolves to
    loopback (as on a Debian host): it passes, and says once that its store listens on every
    interface."""
    host = socket.gethostname()
    try:
        resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        pytest.skip(f"this host's name {host} does not resolve")
    if not resolved.startswith("127.") or host.lower() == "localhost":
        pytest.skip(f"this host's name {host} resolves to {resolved}, not loopback")
    port = free_port()
    env = base_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR=host, MASTER_PORT=str(port))
    env["LOCKSTEP_JOB_KEY"] = KEY
    rank = ForkedRank(["--no-links", "--timeout", "60"], env, tmp_path)
    out, err = rank.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert rank.returncode == 0, (out[-2000:], err[-2000:])
    assert "PASS: 1 rank" in out, out
    assert warnings(err) == [
        f"{WARNING} {port} listens on every interface, since {host} resolves to loopback "
        f"({resolved}) here; give the rendezvous endpoint (MASTER_ADDR, --rdzv-endpoint) as "
        "this host's address to keep it on one"
    ], err
