"""Signed verdicts between namespace nodes (issue 36): a process on another node of the bed,
using only `TCPStore(host, port, is_master=False)` (tests/support/forger.py), writes a forged
verdict, malformed and replayed check-ins, and a forged link figure into the stores preflight
serves on ls0. Each is refused with one line naming it and the sender it claims; the honest
nodes' verdict stands (a pass stays a pass, never one made by the forger)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import lockstep
from lockstep.preflight.store import Signer
from lockstep_testbed import Cluster
from support.forger import encoded

pytestmark = pytest.mark.cluster

KEY = "7d2e" * 16
OTHER_KEY = b"not-the-job-key-" * 2
PORT = 29600
NODES = "lockstep/nodes/checkin"
READ_GRACE_S = 5.0  # node 1 posted its check-in: by then it has read the answer there
FORGER = Path(__file__).resolve().parents[1] / "support" / "forger.py"
# the nodes run the lockstep this test imported (a worktree's src/ too)
ENV = {"LOCKSTEP_JOB_KEY": KEY, "PYTHONPATH": str(Path(lockstep.__file__).resolve().parents[1])}


def forger(bed: Cluster, k: int, port: int, actions: list):
    """The forger on node k against ls0:port; started now, `connected` on its first line."""
    script = bed.shared / "forger.py"
    shutil.copy(FORGER, script)
    argv = [bed.python, str(script), bed.address(0), str(port), encoded(actions)]
    return bed.popen(k, argv, env=ENV, stderr=subprocess.PIPE)


def node(bed: Cluster, k: int, rank: int, nnodes: int, port: int, timeout: int, env=None):
    argv = [bed.python, "-m", "lockstep", "preflight", "--nnodes", str(nnodes)]
    argv += ["--node-rank", str(rank), "--rdzv-endpoint", f"{bed.hostname(0)}:{port}"]
    argv += ["--timeout", str(timeout), "--no-links", "--require-key"]
    return bed.popen(k, argv, env={**ENV, **(env or {})}, stderr=subprocess.PIPE)


def seal(key: bytes, nonce: str, store_key: str, by: str, value: object) -> bytes:
    return Signer(key, nonce).seal(store_key, by, json.dumps(value))


def test_a_verdict_forged_from_another_node_is_refused_and_the_pass_stands(cluster):
    """ls1 sets the check-in's verdict (failed, exit 1, a made-up problem) before ls2 (node 1)
    arrives; ls2 reads it, refuses it, waits on and takes node 0's verdict; all nodes pass.
    Node 0 can answer only once node 2 (ls3) has checked in too, and node 2 starts
    `READ_GRACE_S` after ls2 posted its check-in (a watcher on ls1 waits for the post): with
    two nodes, node 0's answer could overwrite the forged one before a slowed ls2 read it."""
    bed = cluster
    forged = {
        "v": {"verdict": {"ok": False, "exit_code": 1, "line": "made up"}, "run_id": "forged"},
        "fresh": {},
    }
    value = seal(OTHER_KEY, "f" * 32, f"{NODES}/answer", "node 0 on ls0", forged)
    attack = forger(bed, 1, PORT + 1, [["set", f"{NODES}/answer", value]])
    node0 = node(bed, 0, 0, 3, PORT, 60)
    assert attack.stdout.readline().strip() == "connected"
    bed.wait_all({1: attack}, timeout=60)
    watcher = forger(bed, 1, PORT + 1, [["wait", f"{NODES}/post/1"]])
    node1 = node(bed, 2, 1, 3, PORT, 60)
    assert watcher.stdout.readline().strip() == "connected"
    bed.wait_all({1: watcher}, timeout=60)
    time.sleep(READ_GRACE_S)  # ls2 reads the answer at once after its post
    node2 = node(bed, 3, 2, 3, PORT, 60)
    results = bed.wait_all({0: node0, 2: node1, 3: node2}, timeout=240)
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert {n: r.returncode for n, r in results.items()} == {"ls0": 0, "ls2": 0, "ls3": 0}, out
    assert "made up" not in json.dumps(out)
    assert (
        f"preflight: forged value at {NODES}/answer (claims node 0 on ls0): its MAC does not "
        "match" in results["ls2"].stderr
    ), out
    assert sum("PASS: 3 ranks on 3 nodes" in text for text in out.values()) == 1, out


def test_check_ins_malformed_and_replayed_from_another_node_are_named(cluster):
    """Node 0 of 3 on ls0 alone; ls3 posts node 1's check-in as bytes that parse as nothing,
    node 2's as an earlier run signed it, and counts both: node 0 names both, exit 1."""
    bed = cluster
    checkin = {"node": 2, "host": "ls2", "nproc": 1, "problems": []}
    replayed = seal(
        KEY.encode(), "e" * 32, f"{NODES}/post/2", "node 2 on ls2", {"v": checkin, "fresh": "1"}
    )
    actions = [
        ["set", f"{NODES}/post/1", b"\x00garbage"],
        ["set", f"{NODES}/post/2", replayed],
        ["add", f"{NODES}/count", 2],
    ]
    attack = forger(bed, 3, PORT + 11, actions)
    node0 = node(bed, 0, 0, 3, PORT + 10, 60)
    results = bed.wait_all({3: attack, 0: node0}, timeout=240)
    result = results["ls0"]
    assert result.returncode == 1, result.stdout + result.stderr
    line = result.stdout.strip()
    assert "\n" not in line and "Traceback" not in result.stderr, result
    assert f"node 1's check-in (ranks 1): malformed value at {NODES}/post/1" in line
    assert (
        f"node 2's check-in (ranks 2): replayed value at {NODES}/post/2 (claims node 2 on ls2)"
        in line
    )


def test_a_link_figure_forged_from_another_node_never_reaches_the_report(cluster):
    """Ranks by hand on ls0 and ls1 (the link stage across them: its readings travel by
    collective, sealed); ls2 takes rank 1's slot on the stage's status board first with a
    status naming 31337 Gb/s. Rank 0 refuses it; both exit 1."""
    bed = cluster
    report = bed.shared / "signed-links.json"
    board = "lockstep/preflight/./links/end"
    status = {"state": "failed", "why": "round 1: waiting on rank 0: 31337 Gb/s"}
    forged = {"v": status, "fresh": "0"}
    value = seal(OTHER_KEY, "f" * 32, f"{board}/post/1", "rank 1 on ls1", forged)
    port = PORT + 20
    actions = [
        ["wait", "lockstep/preflight/./checkin/answer"],
        ["add", f"{board}/claim/1", 1],
        ["set", f"{board}/post/1", value],
        ["add", f"{board}/count", 1],
    ]

    def rank(k: int):
        env = {**ENV, "RANK": str(k), "WORLD_SIZE": "2", "MASTER_ADDR": bed.hostname(0)}
        env["MASTER_PORT"] = str(port)
        argv = [bed.python, "-m", "lockstep", "preflight", "--timeout", "60", "--links"]
        return bed.popen(k, [*argv, "--json", str(report)], env=env, stderr=subprocess.PIPE)

    rank0 = rank(0)
    attack = forger(bed, 2, port, actions)
    assert attack.stdout.readline().strip() == "connected"
    rank1 = rank(1)
    results = bed.wait_all({2: attack, 0: rank0, 1: rank1}, timeout=240)
    out = {n: r.stdout + r.stderr for n, r in results.items()}
    assert results["ls0"].returncode == 1 and results["ls1"].returncode == 1, out
    # torch's server logs its own `[W...]` line about the forger's socket; lockstep's is one
    (err,) = [x for x in results["ls0"].stderr.splitlines() if not x.startswith("[W")]
    assert f"forged value at {board}/post/1 (claims rank 1 on ls1)" in err
    assert "31337" not in json.dumps(out) and not report.exists()
