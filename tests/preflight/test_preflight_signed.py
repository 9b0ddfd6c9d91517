"""Signed verdicts (issue 36): another process that reaches preflight's stores through
`TCPStore(host, port, is_master=False)` alone (`support.forger`) cannot write, forge or crash
the verdict. Each forgery is refused with one line naming it and the sender it claims; the
honest ranks' verdict stands. On main these ended in `PASS (forged by another host)`, a report
carrying the forged figure, and a 29-line JSONDecodeError traceback.

Launches are few and small: preflight's node check-in alone (no torchrun behind it: a node with
a problem ends it), and one pair of ranks by hand for the link stage.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockstep.launch import free_port
from lockstep.preflight.store import Signer, connect
from support.forger import encoded
from support.forger import main as forge_main
from support.inprocess import run_main
from support.preflight_ranks import (
    LAUNCH_TIMEOUT_S,
    Forked,
    base_env,
    by_hand,
    endpoint_port,
    finish,
)

KEY = "3c1f9a7e" * 8  # the job's key: every honest process has it
OTHER_KEY = b"not-the-job-key-" * 2
NODES = "lockstep/nodes/checkin"


def node(k: int, nnodes: int, port: int, cwd: Path, timeout: int = 30, **env: str):
    """`lockstep preflight` as node `k` of `nnodes`: a new interpreter, as a node's command is.
    PORT: `endpoint_port()`'s, so that node 0 can serve the check-in at PORT+1."""
    cmd = [sys.executable, "-m", "lockstep", "preflight", "--nnodes", str(nnodes)]
    cmd += ["--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--timeout", str(timeout), "--no-links"]
    return subprocess.Popen(
        cmd,
        env=base_env(LOCKSTEP_JOB_KEY=KEY, **env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_forger(port: int, actions: list) -> Forked:
    """The forger (a process of its own, forked: `support.forger.main`), started beside the
    honest process it attacks; `connected` says when it reached the store."""
    name = ["forger", "127.0.0.1", str(port)]
    return Forked(name, base_env(), forge_main, "127.0.0.1", str(port), encoded(actions))


def connected(forger: Forked, *honest) -> None:
    """The forger reached the store; if it did not, why (its error, the honest processes')."""
    if forger.stdout.readline().strip() == "connected":
        return
    for proc in honest:
        proc.kill()
    said = [proc.communicate(timeout=LAUNCH_TIMEOUT_S) for proc in (forger, *honest)]
    tails = [[text[-500:] for text in streams] for streams in said]  # stdout, stderr each
    raise AssertionError(f"the forger never connected; it and the honest processes said: {tails}")


def done(forger: Forked) -> None:
    assert forger.wait(timeout=LAUNCH_TIMEOUT_S) == 0
    forger.stdout.close(), forger.stderr.close()


def envelope(signer: Signer, key: str, by: str, value: object) -> bytes:
    return signer.seal(key, by, json.dumps(value))


def one_line(text: str) -> bool:
    return "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_a_forged_node_verdict_is_refused_and_the_honest_one_stands(tmp_path):
    """The issue's case: another host sets the check-in's verdict (ok, exit 0) before node 1
    reads it. Node 1 names the forgery in one line and takes node 0's verdict, which fails
    on node 1's own problem (an interface that is not there)."""
    port = endpoint_port()
    forged = {
        "v": {
            "verdict": {"ok": True, "exit_code": 0, "line": "PASS (forged by another host)"},
            "run_id": "forged",
        },
        "fresh": {"1": "0" * 16},
    }
    claims = f"node 0 on {socket.gethostname()}"
    value = envelope(Signer(OTHER_KEY, "f" * 32), f"{NODES}/answer", claims, forged)
    forger = start_forger(port + 1, [["set", f"{NODES}/answer", value]])
    node0 = node(0, 2, port, tmp_path)
    connected(forger, node0)
    done(forger)  # the forged verdict is there before node 1 arrives
    node1 = node(1, 2, port, tmp_path, GLOO_SOCKET_IFNAME="absent0")
    results = finish({0: node0, 1: node1})
    assert [results[k]["rc"] for k in (0, 1)] == [1, 1], results
    assert "forged by another host" not in json.dumps(results)
    for k in (0, 1):
        assert "GLOO_SOCKET_IFNAME names absent0" in results[k]["out"], results[k]
    err = results[1]["err"]
    assert one_line(err), err
    assert f"forged value at {NODES}/answer (claims {claims}): its MAC does not match" in err


def test_a_malformed_and_a_replayed_check_in_are_named_not_believed(tmp_path):
    """Node 0 of 3 alone; another process posts node 1's check-in as bytes that parse as
    nothing (on main: a 29-line JSONDecodeError traceback), node 2's as an earlier run signed
    it (the job's key, another nonce), and counts both as arrived (a counter cannot be
    signed). Node 0 names both in its one verdict line, exit 1, at once."""
    port = endpoint_port()
    earlier = Signer(KEY.encode(), "e" * 32)  # what a run before this one signed
    checkin = {"node": 2, "host": "ls-old", "nproc": 1, "problems": []}
    replayed = envelope(
        earlier, f"{NODES}/post/2", "node 2 on ls-old", {"v": checkin, "fresh": "1"}
    )
    forger = start_forger(
        port + 1,
        [
            ["set", f"{NODES}/post/1", b'{"node": 1, "host": '],
            ["set", f"{NODES}/post/2", replayed],
            ["add", f"{NODES}/count", 2],
        ],
    )
    node0 = node(0, 3, port, tmp_path, timeout=120)
    connected(forger, node0)
    done(forger)
    started = time.monotonic()
    result = finish({0: node0})[0]
    assert result["rc"] == 1, result
    line = result["out"].strip()
    assert one_line(line) and line.startswith("preflight: 2 of 3 nodes cannot start"), line
    assert "Traceback" not in result["err"]
    assert (
        f"node 1's check-in (ranks 1): malformed value at {NODES}/post/1 (claims no sender)" in line
    )
    assert (
        f"node 2's check-in (ranks 2): replayed value at {NODES}/post/2 (claims node 2 on "
        "ls-old): signed for another run of this job key" in line
    )
    assert time.monotonic() - started < 60  # decided on the (forged) count, not at --timeout


def test_a_forged_link_figure_never_reaches_the_report(tmp_path):
    """Two ranks by hand with the link stage (`--links`). The readings travel by collective,
    sealed (tests/preflight/test_preflight_links_results.py); what is left of the stage in the
    store is its status board, where a rank whose stage ended early says why. Another process
    claims rank 1's slot there first and posts a status naming a figure of 31337 Gb/s (a
    forged failure would drain a healthy node). Rank 0 refuses it in one line; both ranks exit
    1; no report carries the figure."""
    report = tmp_path / "report.json"
    key = {"LOCKSTEP_JOB_KEY": KEY}
    args = ["--links", "--timeout", "20", "--json", str(report)]
    port, procs = by_hand(2, [0], tmp_path, args=args, per_rank_env={0: key})
    board = "lockstep/preflight/./links/end"
    status = {"state": "failed", "why": "round 0: waiting on rank 0: 31337 Gb/s"}
    forged = {"v": status, "fresh": "0"}
    claims = f"rank 1 on {socket.gethostname()}"
    value = envelope(Signer(OTHER_KEY, "f" * 32), f"{board}/post/1", claims, forged)
    actions = [
        ["wait", "lockstep/preflight/./checkin/answer"],
        ["add", f"{board}/claim/1", 1],
        ["set", f"{board}/post/1", value],
        ["add", f"{board}/count", 1],
    ]
    forger = start_forger(port, actions)
    connected(forger)  # before rank 1 arrives
    rank1 = {1: {**key, "MASTER_PORT": str(port)}}
    procs.update(by_hand(2, [1], tmp_path, args=args, per_rank_env=rank1)[1])
    done(forger)
    results = finish(procs)
    assert [results[r]["rc"] for r in (0, 1)] == [1, 1], results
    err = results[0]["err"].strip()
    assert one_line(err), err
    assert f"forged value at {board}/post/1 (claims {claims}): its MAC does not match" in err
    assert "31337" not in json.dumps(results) and not report.exists()


def test_a_served_store_listens_on_the_rendezvous_address_only():
    """Preflight's own listeners bind the address the job rendezvous on: a store served for
    127.0.0.1 is not reachable at 127.0.0.2 (torch's own listener takes every interface)."""
    port = free_port()
    messages = {"unreachable": "-", "cannot_serve": "-", "name": "-"}
    store = connect("127.0.0.1", port, serve=True, timeout_s=5, reach_s=1, messages=messages)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
    finally:
        del store


def test_the_job_key_file_must_be_the_users_alone(tmp_path):
    """A key file group or others can read is refused before any rank starts: one line, exit
    2; so is `--require-key` without a key (under a launcher, where none is made)."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    os.chmod(key_file, 0o640)
    env = base_env(LOCKSTEP_JOB_KEY_FILE=str(key_file))
    got = run_main(["preflight", "--nproc", "2"], tmp_path, environ=env)
    assert got.returncode == 2 and one_line(got.stderr), got.stderr
    assert f"LOCKSTEP_JOB_KEY_FILE={key_file} is open to group or others (mode 640)" in got.stderr
    assert KEY not in got.stdout + got.stderr
    alone = base_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    got = run_main(["preflight", "--require-key"], tmp_path, environ=alone)
    assert got.returncode == 2 and one_line(got.stderr), got.stderr
    assert (
        "no job key is set (--require-key): give every host the same LOCKSTEP_JOB_KEY" in got.stderr
    )
