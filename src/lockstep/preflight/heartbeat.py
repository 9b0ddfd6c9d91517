"""Rank 0's heartbeat: the ranks waiting for rank 0 fail on a stalled rank 0, not on a slow one.

Rank 0 beats every `beat_s` from a thread of its own, on a store connection of its own (a long
blocking call of its main thread cannot hold a beat back): beat K is the signed key `beat/K`,
and `heartbeat` repeats the latest, each naming rank 0's host and the answers rank 0 has posted
so far (`posted`); posting an answer beats at once. A rank waiting for one of those answers
(`Watch.wait_for`: the check-in's answer, the verdict, the failure diagnosis) reads `heartbeat`
once, then waits for each next beat in one blocking wait: as long as the beats come it waits on,
up to an overall limit; when none came for `stall_s` it ends with exit 3, naming rank 0 and its
host. A waiter makes two store operations a beat, whatever the job's size; nothing is polled
(at 64k ranks and the default 7.5 s beat, about 17k operations a second while they wait), and
only a wait that found rank 0 stalled times out (torch logs that wait in two lines of its own).
A forged beat is refused (`store.Refused`), never believed.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from lockstep.errors import RankTimeout
from lockstep.preflight.lines import first_line
from lockstep.preflight.store import Store

KEY = "heartbeat"
BEATS_PER_STALL = 2  # a beat late by up to one interval is not a stall
FAULT_ENV = "LOCKSTEP_PREFLIGHT_FAULT"  # tests: "stall:S" / "slow:S" on rank 0, see `planted`


def intervals(timeout_s: float) -> tuple[float, float]:
    """(beat every, stall after) for `--timeout`: a quarter of it, within 2 s and 15 s."""
    stall_s = min(15.0, max(2.0, timeout_s / 4))
    return stall_s / BEATS_PER_STALL, stall_s


class Heartbeat:
    """Rank 0's side: `start` beats once and starts the thread, `stop` ends it."""

    def __init__(self, store: Store, every_s: float, host: str | None = None):
        self.every_s = every_s
        self.host = host or socket.gethostname()
        self._store = Store(store.raw.clone(), store.signer, store.by, store.prefix)
        self._posted: list[str] = []
        self._beat = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lockstep-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    @property
    def beats(self) -> int:
        return self._beat

    def posted(self, key: str) -> None:
        """Rank 0 posted the answer at `key`: the waiters learn it from this beat."""
        with self._lock:
            self._posted.append(key)
        self.beat()

    def beat(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._beat += 1
            value = {"beat": self._beat, "host": self.host, "posted": self._posted}
            self._store.put(f"beat/{self._beat}", value)
            self._store.put(KEY, value)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.every_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.beat()
            except (RuntimeError, ValueError):  # the store is gone: nobody left to tell
                return


class Watch:
    """A rank waiting for rank 0's answers; `fallback`: how to name rank 0 before any beat."""

    def __init__(self, store: Store, stall_s: float, fallback: str = "rank 0"):
        self.store, self.stall_s, self.who = store, stall_s, fallback

    def wait_for(self, key: str, within_s: float, what: str = "") -> bool:
        """Whether rank 0 posted `key` within `within_s` (False: its heartbeat went on, the
        answer did not come); `RankTimeout` naming rank 0 when no beat came for `stall_s`."""
        what = what or key
        deadline = time.monotonic() + within_s
        beat = self._read(KEY, min(within_s, self.stall_s), what)
        while key not in beat["posted"]:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            beat = self._read(f"beat/{beat['beat'] + 1}", min(left, self.stall_s), what)
        return True

    def _read(self, key: str, within_s: float, what: str) -> dict:
        try:
            got = self.store.wait_for(key, within_s)
            beat = self.store.get(key, _is_beat) if got else None
        except (RuntimeError, ValueError) as err:
            raise RankTimeout(
                f"{self.who} did not answer: the store stopped answering while this rank "
                f"waited for {what}: {first_line(err)}"
            ) from None
        if beat is None:
            if within_s < self.stall_s:
                return {"beat": -1, "posted": []}  # the overall limit, not a stall
            raise RankTimeout(
                f"{self.who} did not answer: no heartbeat from it for {self.stall_s:g}s while "
                f"this rank waited for {what} (stalled, stopped, or its node lost)"
            )
        self.who = f"rank 0 on {beat['host']}"
        return beat


def planted(beat: Heartbeat | None, node=None) -> None:
    """Tests only: `LOCKSTEP_PREFLIGHT_FAULT=stall:S` makes rank 0 stop beating (on the store
    and, as its node's leader, on the node's channel: `node`) and then sleep S seconds (a
    stalled rank 0), `slow:S` sleep S seconds beating (a slow one)."""
    kind, _, seconds = os.environ.get(FAULT_ENV, "").partition(":")
    if beat is None or kind not in ("stall", "slow"):
        return
    if kind == "stall":
        beat.stop()
        if node is not None:
            node.stop_beats()
    print(f"lockstep: planted {kind} on rank 0 at {time.time():.3f}", file=sys.stderr, flush=True)
    time.sleep(float(seconds))


def _is_beat(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("beat"), int)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("posted"), list)
    )
