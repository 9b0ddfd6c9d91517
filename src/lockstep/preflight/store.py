"""Preflight's one way to the c10d store: connect to it (or serve it), read and write values
under a key, poll with a deadline, and the check-in built on those.

Every read and write of preflight's protocols (the node check-in, the ranks' check-in and
verdict, the link stage) goes through `Store`, so what travels can be checked in one place.
The process group itself gets `Store.raw`.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from datetime import timedelta

from lockstep.errors import RankTimeout, UsageError
from lockstep.preflight.lines import first_line

POLL_S = 0.05


class Store:
    """A torch.distributed store (or a prefix of one), values as JSON."""

    def __init__(self, raw):
        self.raw = raw

    def prefixed(self, prefix: str) -> Store:
        import torch.distributed as dist

        return Store(dist.PrefixStore(prefix, self.raw))

    def put(self, key: str, value: object) -> None:
        self._write(key, json.dumps(value))

    def put_text(self, key: str, text: str) -> None:
        """`text`, JSON already (a fingerprint's canonical form)."""
        self._write(key, text)

    def get(self, key: str):
        return json.loads(self._read(key))

    def has(self, key: str) -> bool:
        return self.raw.check([key])

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

    def _write(self, key: str, text: str) -> None:
        self.raw.set(key, text)

    def _read(self, key: str) -> bytes:
        return self.raw.get(key)


class CheckIn:
    """Everyone posts under its index; index 0 gathers what arrived within a deadline, decides
    and posts one answer; the others wait for it and say they read it, so that index 0 (and
    the store it may serve) stays up until they did (`linger`). An index posted twice keeps
    the first post (`claimed_twice` names it)."""

    def __init__(self, store: Store, prefix: str):
        self.store = store
        self.prefix = prefix

    def post(self, me: int, value: object, who: str = "") -> None:
        if self.store.add(f"{self.prefix}/claim/{me}") > 1:
            self.store.put(f"{self.prefix}/twice/{me}/{uuid.uuid4().hex[:6]}", who)
        else:
            self.store.put(f"{self.prefix}/post/{me}", value)
        self.store.add(f"{self.prefix}/count")

    def gather(self, expected: int, deadline: float) -> dict[int, object]:
        """Index 0: what arrived of `expected` posts by `deadline` (monotonic)."""
        self.store.wait_count(f"{self.prefix}/count", expected, deadline)
        return self.store.posted(f"{self.prefix}/post", expected)

    def read(self, index: int):
        """One index's post, after `gather`."""
        return self.store.get(f"{self.prefix}/post/{index}")

    def claimed_twice(self, expected: int) -> list[int]:
        return [k for k in range(expected) if self.store.count(f"{self.prefix}/claim/{k}") > 1]

    def answer(self, value: object) -> None:
        self.store.put(f"{self.prefix}/answer", value)

    def await_answer(self, within_s: float):
        """The others: index 0's answer, or None when none came within `within_s`."""
        if not self.store.wait_for(f"{self.prefix}/answer", within_s):
            return None
        value = self.store.get(f"{self.prefix}/answer")
        self.store.add(f"{self.prefix}/read")
        return value

    def linger(self, readers: int, within_s: float) -> None:
        """Index 0: stay until `readers` have read the answer, at most `within_s`."""
        self.store.wait_count(f"{self.prefix}/read", readers, time.monotonic() + within_s)


def connect(
    host: str,
    port: int,
    *,
    serve: bool,
    timeout_s: float,
    reach_s: float,
    messages: dict[str, str],
    bind: str | None = None,
    multi_tenant: bool = False,
) -> Store:
    """The TCPStore at HOST:PORT, served here (on `bind`, else HOST) when `serve`.
    A client first polls the port itself for `reach_s` (`reachable`). `messages`: the
    one-line errors, `unreachable` (nothing answered: RankTimeout), `cannot_serve` (UsageError)
    and `name` (what stopped answering: RankTimeout), the error's first line appended."""
    import torch.distributed as dist

    where = f"{host}:{port}"
    if not serve and not reachable(host, port, reach_s):
        raise RankTimeout(messages["unreachable"])
    try:
        raw = dist.TCPStore(
            bind if serve and bind else host,
            port,
            is_master=serve,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=multi_tenant,
        )
    except RuntimeError as err:
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
