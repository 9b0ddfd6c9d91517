"""Preflight's one way to the c10d store: connect to it (or serve it), read and write signed
values under a key, poll with a deadline, and the check-in built on those.

Every read and write of preflight's protocols (the node check-in, the ranks' check-in and
verdict, the link stage) goes through `Store`, so what travels is signed and checked in one
place. Each value travels in an envelope: `lockstep-mac1 NONCE MAC "BY"` on one line, then the
value (JSON). MAC is HMAC-SHA256 under the job's key (`job_key`) over (the run's nonce, the full
store key, the sender it claims, the value), so a value is refused when another writer made it
(forged), when it does not parse (malformed) and when an earlier run with the same key signed
it (replayed): `Refused`, one line naming the key and the sender it claims. Rank 0 makes the
run's nonce (`begin_run`); the check-in's answer echoes each poster's fresh challenge, so a
whole earlier run replayed (nonce and answer) is refused too. Counters (`add`) and deletions
cannot be signed: a forged count or a deleted key can only make a wait end early or late,
which the protocols name as missing ranks or a timeout, never as a pass. Without a key the
values travel unsigned (and unchecked): the verdict says UNAUTHENTICATED.
The process group itself gets `Store.raw`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from lockstep.errors import CheckFailed, RankTimeout, UsageError
from lockstep.preflight.lines import first_line
from lockstep.preflight.listener import listen

POLL_S = 0.05
BATCH = 1024  # keys a batched read asks for in one round trip
_MAGIC = b"lockstep-mac1"
_DOMAIN = b"lockstep-preflight-1"
_NO_NONCE = "-"  # the nonce's own envelope: signed before any run nonce exists
NONCE_KEY = "nonce"


class Refused(CheckFailed):
    """A value read from a store that is not believed: `kind` forged, malformed or replayed;
    `key` where it was; `by` the sender it claims (None when it names none)."""

    def __init__(self, kind: str, key: str, by: str | None, why: str):
        claims = f"claims {by}" if by else "claims no sender"
        self.detail = f"{kind} value at {key} ({claims}): {why}; refused"
        super().__init__(f"preflight: {self.detail}")
        self.kind, self.key, self.by, self.why = kind, key, by, why


class Signer:
    """The job's key (None: unauthenticated) and this run's nonce: seals and opens values."""

    def __init__(self, key: bytes | None, nonce: str = _NO_NONCE):
        self.key = key
        self.nonce = nonce

    @property
    def authenticated(self) -> bool:
        return self.key is not None

    def run(self, nonce: str) -> Signer:
        return Signer(self.key, nonce)

    def mac(self, nonce: str, key: str, by: str, data: bytes) -> bytes:
        """HMAC-SHA256 over the length-prefixed fields (no two field lists give one input)."""
        assert self.key is not None
        fields = (_DOMAIN, nonce.encode(), key.encode(), by.encode(), data)
        message = b"".join(len(f).to_bytes(8, "big") + f for f in fields)
        return hmac.digest(self.key, message, hashlib.sha256)  # one call: OpenSSL's, fast

    def seal(self, key: str, by: str, text: str) -> bytes:
        data = text.encode()
        mac = self.mac(self.nonce, key, by, data).hex() if self.key else "-"
        header = b" ".join([_MAGIC, self.nonce.encode(), mac.encode(), json.dumps(by).encode()])
        return header + b"\n" + data

    def open(self, key: str, raw: bytes) -> tuple[str, str]:
        """(the sender it claims, the value's text) of a sealed value, or `Refused`."""
        header, _, data = bytes(raw).partition(b"\n")
        parts = header.split(b" ", 3)
        try:
            by = json.loads(parts[3]) if len(parts) == 4 and parts[0] == _MAGIC else None
            text = data.decode()
        except (ValueError, UnicodeDecodeError):
            by = text = None
        if not isinstance(by, str) or text is None:
            raise Refused("malformed", key, None, "not a signed lockstep value")
        if self.key is None:
            return by, text
        nonce, mac = parts[1].decode("ascii", "replace"), parts[2]
        if mac == b"-":
            raise Refused(
                "forged", key, by, "it is unsigned (another writer, or a host without the job key)"
            )
        expected = self.mac(nonce, key, by, data).hex().encode()
        if not hmac.compare_digest(mac, expected):
            raise Refused(
                "forged",
                key,
                by,
                "its MAC does not match the job key (another "
                "writer, or a host with another LOCKSTEP_JOB_KEY)",
            )
        if nonce != self.nonce:
            raise Refused("replayed", key, by, "signed for another run of this job key")
        return by, text

    def row_mac(self, name: str, rank: int, data: bytes) -> bytes:
        """32 bytes for a row gathered through a collective (zeros without a key)."""
        return self.mac(self.nonce, f"{name}/{rank}", "", data) if self.key else bytes(32)

    def row_ok(self, name: str, rank: int, data: bytes, mac: bytes) -> bool:
        return self.key is None or hmac.compare_digest(self.row_mac(name, rank, data), mac)


class Store:
    """A torch.distributed store (or a prefix of one), values as signed JSON. `by`: the
    sender this process's values claim (`rank 3 on host`)."""

    def __init__(self, raw, signer: Signer | None = None, by: str = "", prefix: str = ""):
        self.raw = raw
        self.signer = signer or Signer(None)
        self.by = by
        self.prefix = prefix  # the full store key of this Store's key "": what the MAC covers

    def prefixed(self, prefix: str) -> Store:
        import torch.distributed as dist

        raw = dist.PrefixStore(prefix, self.raw)
        return Store(raw, self.signer, self.by, f"{self.prefix}{prefix}/")

    def signed(self, signer: Signer, by: str) -> Store:
        return Store(self.raw, signer, by, self.prefix)

    def begin_run(self, *, make: bool, within_s: float) -> Store | None:
        """This Store under the run's nonce: made and posted here (`make`, rank 0), else read
        (None when none came within `within_s`)."""
        if make:
            nonce = secrets.token_hex(16)
            self.put(NONCE_KEY, nonce)
        else:
            nonce = self.wait_value(NONCE_KEY, time.monotonic() + within_s, shape=_is_hex)
            if nonce is None:
                return None
        return self.signed(self.signer.run(nonce), self.by)

    def put(self, key: str, value: object) -> None:
        self._write(key, json.dumps(value))

    def put_text(self, key: str, text: str) -> None:
        """`text`, JSON already (a fingerprint's canonical form)."""
        self._write(key, text)

    def get(self, key: str, shape: Callable[[object], bool] | None = None):
        """The value at `key`, opened and parsed; `Refused` when it is not believed or does not
        have the `shape` asked for."""
        return self._parse(key, self._read(key), shape)

    def get_many(self, keys: list[str], shape: Callable[[object], bool] | None = None) -> list:
        """The values at `keys` in one round trip (they must all be set), each checked."""
        raws = self.raw.multi_get(keys) if keys else []
        return [self._parse(k, raw, shape) for k, raw in zip(keys, raws, strict=True)]

    def wait_value(self, key: str, deadline: float, shape=None):
        """The first value at `key` that is believed, by `deadline` (monotonic); None when
        none was set. A refused value is stepped over (the honest writer may still overwrite
        it) and named on stderr when an honest one follows; raised at the deadline. One wait
        of torch's until the key is set (each wait that times out logs a C++ warning), then
        polling while what is there is refused."""
        if not self.wait_for(key, max(0.01, deadline - time.monotonic())):
            return None
        refused = None
        while True:
            try:
                value = self.get(key, shape)
            except Refused as err:
                refused = err
            else:
                if refused is not None:
                    print(str(refused), file=sys.stderr, flush=True)
                return value
            if time.monotonic() >= deadline:
                raise refused
            time.sleep(POLL_S)

    def has(self, *keys: str) -> bool:
        """Whether every one of `keys` is set (one round trip)."""
        return self.raw.check(list(keys))

    def add(self, key: str, amount: int = 1) -> int:
        return self.raw.add(key, amount)

    def count(self, key: str) -> int:
        return self.raw.add(key, 0)

    def wait_for(self, key: str, within_s: float) -> bool:
        """Whether `key` was set within `within_s` (torch's own wait, one call)."""
        try:
            self.raw.wait([key], timedelta(seconds=within_s))
        except RuntimeError:
            return False
        return True

    def wait_count(self, key: str, want: int, deadline: float, every: float = POLL_S) -> int:
        """Poll counter `key` until it reaches `want` or `time.monotonic()` passes `deadline`;
        its last value."""
        while (got := self.count(key)) < want and time.monotonic() < deadline:
            time.sleep(every)
        return got

    def posted(self, prefix: str, n: int) -> dict[int, object]:
        """The values of `prefix/0` .. `prefix/n-1` that were set, by index."""
        return {k: self.get(f"{prefix}/{k}") for k in range(n) if self.has(f"{prefix}/{k}")}

    def _parse(self, key: str, raw: bytes, shape) -> object:
        full = self.prefix + key
        by, text = self.signer.open(full, raw)
        try:
            value = json.loads(text)
        except ValueError:
            raise Refused("malformed", full, by, "its value is not JSON") from None
        try:
            fits = shape is None or shape(value)
        except Refused as err:  # the shape's own verdict (a replayed answer), with the sender
            raise Refused(err.kind, full, by, err.why) from None
        if not fits:
            raise Refused("malformed", full, by, "its value is not what this key holds")
        return value

    def _write(self, key: str, text: str) -> None:
        self.raw.set(key, self.signer.seal(self.prefix + key, self.by, text))

    def _read(self, key: str) -> bytes:
        return self.raw.get(key)


def _is_hex(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) >= 16 and all(c in "0123456789abcdef" for c in value)
    )


class CheckIn:
    """Everyone posts under its index; index 0 gathers what arrived within a deadline, decides
    and posts one answer; the others wait for it and say they read it, so that index 0 (and
    the store it may serve) stays up until they did (`linger`). An index posted twice keeps
    the first post (`claimed_twice` names it). Each post carries a fresh challenge that the
    answer echoes, so an answer from an earlier run is refused as replayed. A post that is not
    believed is in `refused` (by index), never in what `gather` returns."""

    def __init__(self, store: Store, prefix: str):
        self.store = store
        self.prefix = prefix
        self.refused: dict[int, Refused] = {}
        self._me: int | None = None
        self._fresh = ""
        self._got: dict[int, object] = {}
        self._challenges: dict[str, str] = {}

    def post(self, me: int, value: object, who: str = "") -> None:
        self._me, self._fresh = me, secrets.token_hex(8)
        if self.store.add(f"{self.prefix}/claim/{me}") > 1:
            self.store.put(f"{self.prefix}/twice/{me}/{uuid.uuid4().hex[:6]}", who)
        else:
            self.store.put(f"{self.prefix}/post/{me}", {"v": value, "fresh": self._fresh})
        self.store.add(f"{self.prefix}/count")

    def count(self) -> int:
        """How many posts arrived so far (one operation)."""
        return self.store.count(f"{self.prefix}/count")

    def gather(self, expected: int, deadline: float, shape=None) -> dict[int, object]:
        """Index 0: what arrived of `expected` posts by `deadline` (monotonic), each post of
        the `shape` given (else refused)."""
        self.store.wait_count(f"{self.prefix}/count", expected, deadline)
        for start in range(0, expected, BATCH):  # one round trip a batch (issue 38)
            keys = [f"{self.prefix}/post/{k}" for k in range(start, min(start + BATCH, expected))]
            try:
                got = self.store.get_many(keys, _posted(shape)) if self.store.has(*keys) else None
            except Refused:  # read again one by one below: each refusal named, the rest kept
                got = None
            for k, key in enumerate(keys, start):
                try:
                    wrapped = got[k - start] if got else self._one(key, shape)
                except Refused as err:
                    self.refused[k] = err
                    continue
                if wrapped is not None:
                    self._got[k] = wrapped["v"]
                    self._challenges[str(k)] = wrapped["fresh"]
        return dict(self._got)

    def _one(self, key: str, shape):
        return self.store.get(key, _posted(shape)) if self.store.has(key) else None

    def read(self, index: int):
        """One index's post (after `gather` on index 0, from what it gathered)."""
        if index in self._got:
            return self._got[index]
        return self.store.get(f"{self.prefix}/post/{index}", _posted(None))["v"]

    def claimed_twice(self, expected: int) -> list[int]:
        return [k for k in range(expected) if self.store.count(f"{self.prefix}/claim/{k}") > 1]

    def answer(self, value: object) -> None:
        self.store.put(f"{self.prefix}/answer", {"v": value, "fresh": self._challenges})

    def await_answer(self, within_s: float, shape=None):
        """The others: index 0's answer, or None when none came within `within_s`; an answer
        that does not echo this index's challenge is refused as replayed."""
        key = f"{self.prefix}/answer"
        answer = self.store.wait_value(key, time.monotonic() + within_s, self._answer_shape(shape))
        if answer is None:
            return None
        self.store.add(f"{self.prefix}/read")
        return answer["v"]

    def _answer_shape(self, shape):
        def ok(value: object) -> bool:
            if not (isinstance(value, dict) and isinstance(value.get("fresh"), dict)):
                return False
            if shape is not None and not shape(value.get("v")):
                return False
            if self._me is not None and value["fresh"].get(str(self._me)) != self._fresh:
                raise Refused(
                    "replayed",
                    self.store.prefix + f"{self.prefix}/answer",
                    None,
                    f"it does not answer this run's check-in of {self._me}",
                )
            return True

        return ok

    def linger(self, readers: int, within_s: float) -> None:
        """Index 0: stay until `readers` have read the answer, at most `within_s`."""
        self.store.wait_count(f"{self.prefix}/read", readers, time.monotonic() + within_s)


def _posted(shape):
    def ok(value: object) -> bool:
        return (
            isinstance(value, dict)
            and isinstance(value.get("fresh"), str)
            and "v" in value
            and (shape is None or shape(value["v"]))
        )

    return ok


def connect(
    host: str,
    port: int,
    *,
    serve: bool,
    timeout_s: float,
    reach_s: float,
    messages: dict[str, str],
    multi_tenant: bool = False,
) -> Store:
    """The TCPStore at HOST:PORT, served here when `serve`: listening on HOST's address only
    (`listen`), not on every interface. A client first polls the port itself for `reach_s`
    (`reachable`). `messages`: the one-line errors, `unreachable` (nothing answered:
    RankTimeout), `cannot_serve` (UsageError) and `name` (what stopped answering:
    RankTimeout), the error's first line appended."""
    import torch.distributed as dist

    where = f"{host}:{port}"
    if not serve and not reachable(host, port, reach_s):
        raise RankTimeout(messages["unreachable"])
    fd, address = None, host
    try:
        if serve:
            fd, address = listen(host, port)
        raw = dist.TCPStore(
            address,
            port,
            is_master=serve,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=multi_tenant,
            master_listen_fd=fd,
            use_libuv=True,
        )
    except (RuntimeError, OSError) as err:
        if fd is not None:
            os.close(fd)
        if serve:
            raise UsageError(f"{messages['cannot_serve']}: {first_line(err)}") from None
        raise RankTimeout(
            f"{messages['name']} at {where} stopped answering: {first_line(err)}"
        ) from None
    return Store(raw)


def reachable(host: str, port: int, within_s: float) -> bool:
    """Poll a store's port ourselves (preflight's store, the check-in's): TCPStore's own retries
    overrun the timeout and log C++ stack traces; this keeps the deadline exact and the message
    one line."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, within_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S * 2)
