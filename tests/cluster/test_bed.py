"""The bed itself: nodes with their own hostname, address, hosts file, /tmp, /dev/shm and PIDs,
reaching each other over the bridge only, and nothing left behind however its owner ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockstep_testbed import HEAD, Cluster, NodeTimeout, unavailable
from lockstep_testbed.namespaces import reap_stale_shared
from lockstep_testbed.processes import descendants
from lockstep_testbed.slurm import DAEMONS as SLURM_DAEMONS

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("bed_available")]

PY = sys.executable


def node_facts(bed: Cluster, k: int) -> dict:
    script = (
        "import json, os, socket, subprocess\n"
        "print(json.dumps({'host': socket.gethostname(), 'hosts': open('/etc/hosts').read(),"
        " 'addr': subprocess.run(['ip', '-4', '-o', 'addr', 'show', 'eth0'],"
        " capture_output=True, text=True).stdout.split()[3].split('/')[0],"
        " 'tmp': sorted(os.listdir('/tmp')), 'shm': sorted(os.listdir('/dev/shm')),"
        " 'pids': len([p for p in os.listdir('/proc') if p.isdigit()]), 'pid': os.getpid()}))"
    )
    return json.loads(bed.run(k, [PY, "-c", script], check=True).stdout)


def test_each_node_has_its_own_hostname_address_hosts_tmp_shm_and_pids():
    with Cluster(3) as bed:
        for k in range(3):
            bed.run(k, ["sh", "-c", f"echo {k} >/tmp/mine-{k} && echo {k} >/dev/shm/shm-{k}"])
        (bed.shared / "from-host").write_text("x")
        bed.run(0, ["sh", "-c", f"echo 0 >{bed.shared}/from-ls0"], check=True)
        for k in range(3):
            facts = node_facts(bed, k)
            assert facts["host"] == bed.hostname(k) == f"ls{k}"
            assert facts["addr"] == bed.address(k)
            for j in range(3):  # every node listed, with its bed address
                assert f"{bed.address(j)}\tls{j}" in facts["hosts"]
            assert f"mine-{k}" in facts["tmp"] and facts["shm"] == [f"shm-{k}"]
            assert not any(f"mine-{j}" in facts["tmp"] for j in range(3) if j != k)
            assert facts["pids"] < 10 and facts["pid"] < 50  # its own PID namespace
        assert (
            bed.run(2, ["cat", f"{bed.shared}/from-ls0", f"{bed.shared}/from-host"]).stdout
            == "0\nx"
        )
        assert (bed.shared / "from-ls0").read_text() == "0\n"
        assert bed.run(HEAD, ["hostname"]).stdout.strip() == bed.head
        assert not Path("/tmp/mine-0").exists()


PLANT = "import pathlib; pathlib.Path(__file__).with_name('ran').write_text('planted')\n"


def test_no_other_user_can_plant_a_module_where_root_runs_lockstep():
    """The shared folder is every node's working folder for root's commands: a `lockstep/`
    planted there would be imported by root's `python -m lockstep` (issue #37). As `nobody`,
    neither the host nor a node can write it; root's lockstep runs the installed package."""
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    with Cluster(2) as bed:
        assert (bed.shared.stat().st_mode & 0o7777) == 0o755
        plant = (
            f'mkdir -p {bed.shared}/lockstep && printf %s "$0" >{bed.shared}/lockstep/__init__.py'
        )
        by_host = subprocess.run(
            [*nobody, "sh", "-c", plant, PLANT], capture_output=True, check=False
        )
        by_node = bed.run(1, [*nobody, "sh", "-c", plant, PLANT])
        assert by_host.returncode != 0 and by_node.returncode != 0
        assert not (bed.shared / "lockstep").exists()
        where = bed.run(0, [PY, "-m", "lockstep", "--help"], check=True)
        assert "usage: lockstep" in where.stdout and not (bed.shared / "lockstep" / "ran").exists()


def test_nodes_reach_each_other_over_the_bridge_and_nothing_else():
    server = (
        "import socket; s = socket.create_server(('0.0.0.0', 7001)); print('up', flush=True);"
        " c, peer = s.accept(); c.sendall(socket.gethostname().encode()); c.close()"
    )
    client = (
        "import socket, sys; c = socket.create_connection((sys.argv[1], 7001), timeout=5);"
        " print(c.recv(100).decode(), c.getsockname()[0])"
    )
    with Cluster(2) as bed:
        srv = bed.popen(1, [PY, "-c", server])
        assert srv.stdout.readline().strip() == "up"
        out = bed.run(0, [PY, "-c", client, "ls1"], check=True, timeout=20).stdout.split()
        assert out == ["ls1", bed.address(0)]
        assert srv.wait(timeout=10) == 0
        routes = bed.run(0, ["ip", "-4", "route"]).stdout.strip().splitlines()
        assert [r.split() for r in routes] == [
            f"{bed.subnet} dev eth0 proto kernel scope link src {bed.address(0)}".split()
        ]
        outside = bed.run(0, ["ip", "route", "get", "1.1.1.1"])
        assert outside.returncode != 0 and "unreachable" in outside.stderr
        assert bed.run(HEAD, ["ip", "-4", "route"]).stdout.count("\n") == 1  # the bridge only


def test_a_command_past_its_timeout_is_killed_and_named():
    with Cluster(3) as bed:
        start = time.monotonic()
        with pytest.raises(NodeTimeout, match=r"ls2: `sh -c 'sleep 60 & sleep 61'` did not"):
            bed.run(2, ["sh", "-c", "sleep 60 & sleep 61"], timeout=0.5)
        assert time.monotonic() - start < 5
        left = bed.run(2, ["ps", "-e", "-o", "args="]).stdout
        assert "sleep 6" not in left, left  # the whole tree went
        with pytest.raises(NodeTimeout, match=r"still running after 0\.5s, killed: ls1"):
            bed.run_all({0: ["true"], 1: ["sleep", "60"]}, timeout=0.5)


def test_two_beds_at_once_never_collide():
    with Cluster(2) as one, Cluster(2) as two:
        assert one.hostname(0) == two.hostname(0)  # the same names, in different namespaces
        server = "import socket; socket.create_server(('0.0.0.0', 7002)); print('up', flush=True)"
        a = one.popen(0, [PY, "-c", server + "; import time; time.sleep(30)"])
        b = two.popen(0, [PY, "-c", server + "; import time; time.sleep(30)"])
        assert a.stdout.readline().strip() == b.stdout.readline().strip() == "up"
        assert one.run(1, ["hostname"]).stdout == two.run(1, ["hostname"]).stdout == "ls1\n"
        assert one.shared != two.shared


def test_fault_hooks_change_one_node_only():
    """Phase 2 plants faults through these; here only that each reaches its one node."""
    with Cluster(3) as bed:
        bed.drop_host(1, "ls0")
        resolve = [bed.run(k, ["getent", "hosts", "ls0"]).returncode for k in range(3)]
        assert resolve == [0, 2, 0]
        bed.set_node_env(2, NCCL_ALGO="Ring")
        seen = [bed.run(k, ["sh", "-c", "echo ${NCCL_ALGO:-unset}"]).stdout for k in range(3)]
        assert seen == ["unset\n", "unset\n", "Ring\n"]
        bed.rename_interface(1, "ens5")
        assert "ens5" in bed.ip(1, "-br", "link") and "eth0" in bed.ip(2, "-br", "link")
        assert bed.run(1, ["getent", "hosts", "ls2"]).returncode == 0
        ping = [PY, "-c", "import socket,sys; socket.create_connection((sys.argv[1], 9), 2)"]
        assert "refused" in bed.run(0, [*ping, "ls1"]).stderr  # reachable (nothing listens)
        bed.link(1, up=False)
        assert "timed out" in bed.run(0, [*ping, "ls1"], timeout=20).stderr
        bed.link(1, up=True)
        bed.rate_limit(2, "1mbit")
        assert "tbf" in bed.tc(2, "qdisc", "show", "dev", "eth0")


_HOLDER = """
import contextlib, json, sys, time
from lockstep_testbed import Cluster, Slurm
with Cluster(2) as bed, Slurm(bed) if sys.argv[1] == "slurm" else contextlib.nullcontext():
    print(json.dumps({"shared": str(bed.shared), "pids": [bed.pid(k) for k in (0, 1, "head")]}),
          flush=True)
    time.sleep(120)
"""


def host_view() -> dict:
    """What the bed must never leave in the host's namespaces."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    return {
        "netns": sorted(netns.split()),
        "links": sorted(line.split(":")[1].strip() for line in links.splitlines()),
        "mounts": sorted(" ".join(line.split()[3:5]) for line in mounts.splitlines()),
    }


def start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_killing_the_owner_leaves_nothing_behind(how):
    with_slurm = all(map(shutil.which, SLURM_DAEMONS[:3]))
    before = host_view()
    # the bed is development only (testbed/): pytest's pythonpath does not reach a child
    testbed = str(Path(__file__).resolve().parents[2] / "testbed")
    path = os.pathsep.join(filter(None, [testbed, os.environ.get("PYTHONPATH")]))
    holder = subprocess.Popen(
        [PY, "-c", _HOLDER, "slurm" if with_slurm else "plain"],
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # SIGINT's default disposition, as from a terminal: under a run started with `&` or
        # nohup it is inherited ignored, and Python would then install no KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        info = json.loads(holder.stdout.readline())
        bed_pids = {pid: start_time(pid) for pid in descendants(holder.pid)}
        assert set(info["pids"]) <= set(bed_pids)
        assert len(bed_pids) > 8  # inits, unshares, and Slurm's daemons when installed
        holder.send_signal(getattr(signal, how))
        holder.wait(timeout=20)
    finally:
        if holder.poll() is None:
            holder.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = {p for p, t in bed_pids.items() if t is not None and start_time(p) == t}
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, f"left running: {alive}"
    after = host_view()
    for key in before:
        assert set(after[key]) - set(before[key]) == set(), f"{key} left behind"
    shared = Path(info["shared"])
    if how == "SIGKILL":  # no stop() ran: the next bed's start removes the folder
        reap_stale_shared()
    assert not shared.exists()


def test_where_no_bed_can_be_built_the_reason_is_one_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = unavailable()
    assert reason and "root" in reason and "\n" not in reason
