"""The node-local channel between a node's leader (local rank 0) and its other ranks (issue 38).

At 64k ranks one store serving every rank's check-in, answer and verdict is the bottleneck; so
each node's leader collects its ranks here and speaks for the node in lockstep's store
(`checkin`), and relays rank 0's answers back. The channel is a Unix socket in Linux's abstract
namespace: it exists only inside this node's network namespace (the cluster bed's namespace
nodes each have their own), it vanishes with the leader (no file left behind, no stale address
from an earlier run), and its name is derived from the job, so every local rank finds it
without a race and two jobs on one node never meet: a hash of the user, the run id,
MASTER_ADDR:MASTER_PORT and the node (the launcher's node rank, else the hostname). A second
leader for one name cannot bind it (named, exit 2).

Everything that travels is signed with the job's key (`store.Signer`): on connect the leader
sends a fresh challenge, the rank's check-in echoes it (a check-in replayed from another run is
refused); every message to the rank echoes the rank's own fresh value and carries its sequence
number in its signed key (a message replayed, reordered or from another writer is refused).
Without a job key nothing is checked, as in the store. The leader beats every `beat_s` from a
thread of its own, so a waiting rank names a stalled leader within the stall interval; a
leader that fails relays its one-line error and exit code (`fail`), so its ranks exit with it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import socket
import struct
import threading
import time

from lockstep.errors import LockstepError, RankTimeout, UsageError
from lockstep.preflight.store import Refused, Signer

POLL_S = 0.05
CLOSING_POLL_S = 0.5
_HEADER = struct.Struct(">I")
_MAX = 64 << 20  # one message's bytes at most (an identity is a few kB)


def name_of(uid: int, run_id: str, master: str, node: str) -> bytes:
    """The channel's abstract socket name for one node of one job."""
    digest = hashlib.sha256(f"{uid}|{run_id}|{master}|{node}".encode()).hexdigest()[:32]
    return b"\0lockstep-preflight-" + digest.encode()


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> bytes | None:
    """One frame; None at end of stream."""
    head = _exact(sock, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > _MAX:
        raise ValueError(f"a frame of {size} bytes")
    return _exact(sock, size) if size else b""


def _exact(sock: socket.socket, size: int) -> bytes | None:
    got = b""
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        if not chunk:
            return None
        got += chunk
    return got


def key_of(name: bytes, what: str) -> str:
    """The key a channel's message is signed under (the MAC covers it)."""
    return f"node/{name[-32:].decode()}/{what}"


class Leader:
    """Local rank 0: serves the channel, gathers its ranks' check-ins, relays to them."""

    def __init__(self, name: bytes, signer: Signer, by: str, members: int):
        self.name, self.signer, self.by, self.members = name, signer, by, members
        self.refused: list[str] = []  # what was not believed, one line each
        self._conns: dict[
            int, tuple[socket.socket, str, int]
        ] = {}  # local rank: (conn, fresh, seq)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(name)
        except OSError as err:
            self._sock.close()
            if err.errno == errno.EADDRINUSE:
                raise UsageError(
                    "preflight: another leader already serves this node's channel (two ranks "
                    "with local rank 0 on one node of one job: check LOCAL_RANK and the node rank)"
                ) from None
            raise
        self._sock.listen(max(16, members))

    def gather(self, deadline: float, closing=lambda: False) -> dict[int, dict]:
        """The check-ins of the node's other ranks that came by `deadline` (monotonic) or
        until `closing()` (asked every `CLOSING_POLL_S` while one is missing), by local rank;
        each refused one is named in `refused`."""
        got: dict[int, dict] = {}
        while len(got) + len(self.refused) < self.members:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._sock.settimeout(min(left, CLOSING_POLL_S))
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                if closing():
                    break
                continue
            except OSError:
                break
            self._admit(conn, deadline, got)
        return got

    def _admit(self, conn: socket.socket, deadline: float, got: dict[int, dict]) -> None:
        challenge = secrets.token_hex(8)
        key = key_of(self.name, "checkin")
        try:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            _send(conn, challenge.encode())
            raw = _recv(conn)
            if raw is None:
                raise ValueError("it closed the channel before its check-in")
            by, text = self.signer.open(key, raw)
            value = json.loads(text)
        except Refused as err:
            self.refused.append(err.detail)
            conn.close()
            return
        except (OSError, ValueError) as err:  # a rank that died mid-way: missing, not refused
            conn.close()
            if not isinstance(err, OSError):
                self.refused.append(f"malformed check-in on the node's channel: {err}; refused")
            return
        local = value.get("local_rank") if isinstance(value, dict) else None
        if not _is_checkin(value) or not 0 < local <= self.members:
            self.refused.append(f"malformed value at {key} (claims {by}): not a check-in; refused")
        elif value["challenge"] != challenge:
            self.refused.append(
                f"replayed value at {key} (claims {by}): it does not answer this leader's "
                "challenge; refused"
            )
        elif local in got:
            self.refused.append(f"local rank {local} checked in twice on the node's channel")
        else:
            got[local] = value["identity"]
            conn.settimeout(None)
            self._conns[local] = (conn, value["fresh"], 0)
            return
        conn.close()

    def send(self, kind: str, value: object = None) -> None:
        """To every rank that checked in (one gone is left alone: it named its own end)."""
        with self._lock:
            for local, (conn, fresh, seq) in list(self._conns.items()):
                key = key_of(self.name, f"to/{local}/{seq}")
                text = json.dumps({"kind": kind, "v": value, "fresh": fresh})
                try:
                    _send(conn, self.signer.seal(key, self.by, text))
                except OSError:
                    conn.close()
                    del self._conns[local]
                    continue
                self._conns[local] = (conn, fresh, seq + 1)

    def fail(self, err: LockstepError) -> None:
        """This leader ends with `err`: its ranks end with the same line and code."""
        self.stop_beats()
        self.send("fail", {"line": str(err), "code": err.exit_code})

    def beat(self, every_s: float) -> Leader:
        def run() -> None:
            while not self._stop.wait(every_s):
                self.send("beat")

        threading.Thread(target=run, name="lockstep-node-beat", daemon=True).start()
        return self

    def stop_beats(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop_beats()
        with self._lock:
            for conn, _, _ in self._conns.values():
                conn.close()
            self._conns.clear()
        self._sock.close()


class Member:
    """A node's other rank: checks in with its leader once, then reads what it relays."""

    def __init__(self, name: bytes, signer: Signer, by: str, leader: str):
        self.name, self.signer, self.by, self.leader = name, signer, by, leader
        self.fresh = secrets.token_hex(8)
        self.seq = 0
        self.local = 0
        self._sock: socket.socket | None = None

    def check_in(self, local_rank: int, identity: dict, within_s: float) -> None:
        """Connect (retried while the leader does not serve yet) and post this rank's check-in."""
        deadline = time.monotonic() + within_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.name)
                break
            except OSError:
                sock.close()
                if time.monotonic() >= deadline:
                    raise RankTimeout(
                        f"{self.leader} never served this node's channel within {within_s:g}s "
                        "(not started, crashed, or another LOCAL_RANK layout)"
                    ) from None
                time.sleep(POLL_S)
        self._sock, self.local = sock, local_rank
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            challenge = _recv(sock)
            if challenge is None:
                raise OSError("closed")
            value = {"local_rank": local_rank, "identity": identity, "fresh": self.fresh,
                     "challenge": challenge.decode()}  # fmt: skip
            _send(sock, self.signer.seal(key_of(self.name, "checkin"), self.by, json.dumps(value)))
        except OSError as err:
            raise RankTimeout(f"{self.leader} stopped answering at the check-in: {err}") from None

    def wait(self, kind: str, within_s: float, stall_s: float, what: str):
        """The leader's next `kind` message's value, read while its beats come (at most
        `within_s`); `RankTimeout` naming the leader when none came for `stall_s`, its error
        (line and exit code) when it relays one."""
        assert self._sock is not None
        deadline = time.monotonic() + within_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankTimeout(
                    f"{self.leader} relayed no {what} within {within_s:g}s (its beats went on)"
                )
            self._sock.settimeout(min(left, stall_s))
            try:
                raw = _recv(self._sock)
            except TimeoutError:
                if left <= stall_s:
                    continue
                raise RankTimeout(
                    f"{self.leader} did not answer: no heartbeat from it for {stall_s:g}s while "
                    f"this rank waited for {what} (stalled, stopped, or its node lost)"
                ) from None
            except (OSError, ValueError) as err:
                raw, _ = None, err
            if raw is None:
                raise RankTimeout(
                    f"{self.leader} stopped answering while this rank waited for {what} "
                    "(it exited or was killed)"
                )
            got = self._open(raw)
            if got["kind"] == "fail":
                raise LockstepError(got["v"]["line"], got["v"]["code"])
            if got["kind"] == kind:
                return got["v"]

    def _open(self, raw: bytes) -> dict:
        key = key_of(self.name, f"to/{self.local}/{self.seq}")
        by, text = self.signer.open(key, raw)
        try:
            value = json.loads(text)
        except ValueError:
            raise Refused("malformed", key, by, "its value is not JSON") from None
        if not (isinstance(value, dict) and isinstance(value.get("kind"), str)):
            raise Refused("malformed", key, by, "not a message of the node's channel")
        if self.signer.key is not None and value.get("fresh") != self.fresh:
            raise Refused("replayed", key, by, "it does not answer this rank's check-in")
        if value["kind"] == "fail" and not _is_failure(value.get("v")):
            raise Refused("malformed", key, by, "not a failure's line and exit code")
        self.seq += 1
        return value

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()


def _is_checkin(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("local_rank"), int)
        and isinstance(value.get("identity"), dict)
        and isinstance(value.get("fresh"), str)
        and isinstance(value.get("challenge"), str)
    )


def _is_failure(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("line"), str)
        and value.get("code") in (1, 2, 3, 4)
    )


def uid() -> int:
    return os.getuid()
