"""The link stage's results as rows gathered by collective, not JSON through the store.

Each pass ends with one `gather` to rank 0 of a row per rank, of a size every rank knows from
the schedule: a slot per round of the pass (a rank has at most one peer a round), each slot the
fields the verdict reads (`fields()`: peer, round, bandwidth and its repeats, the starvation
readings, and what the measurements carry, as float64; None as a NaN no reading makes),
sealed with the rank's MAC under the job key, the run's nonce, the pass and the rank
(`collectives.seal_bytes`). Rank 0 opens every row (`open_rows`): a row whose MAC does not
match is refused as forged, one whose slots are not readings (a peer out of range, a round
outside the pass, a bandwidth that is not a finite number) as malformed, each naming the rank
it claims. Rank 0 then broadcasts what comes next, sealed the same way (`Plan`: the rounds of
the next pass, or none, or an abort naming the refused ranks); that broadcast also tells each
rank that rank 0 holds every row. On NCCL the rows travel on the device.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from lockstep.preflight import collectives
from lockstep.preflight.lines import first_line, ranges
from lockstep.preflight.links import measure
from lockstep.preflight.links.bulk import gc_paused
from lockstep.preflight.links.records import Batch, Records
from lockstep.preflight.store import Refused, Signer

# Every slot's fields before the carried ones: (name, kind). Required ones are never None.
_CORE = (
    ("peer", "int!"),
    ("round", "int!"),
    ("intra", "bool!"),
    ("gbps_out", "float!"),
    ("gbps_low_out", "float"),
    ("reps", "int"),
    ("starved_reps", "int"),
    ("extra_reps", "int"),
    ("starved", "float"),
    ("gbps_ceiling_out", "float"),
    ("cpu_wait_known", "bool"),
)
_NONE = 0x7FF4_0000_DEAD_BEEF  # a signalling NaN's bits: None (no arithmetic yields it)
ABORT_NAMED = 32  # refused ranks an abort names (the count is always there)
_END, _ROUNDS, _ABORT = 0, 1, 2


class Failed(RuntimeError):
    """A collective of the exchange failed, or rank 0 aborted: this rank's stage ends."""


def fields() -> tuple[tuple[str, str], ...]:
    """A slot's (field, kind): the core ones, then each measurement's carried fields, each
    a number and what it was (`_TYPES`: an int or a bool comes back as one)."""
    return _CORE + tuple(f for name in measure.carried() for f in ((name, "num"), (name, "type")))


_TYPES = (float, int, bool)


def _type_code(v: object) -> int:
    return 2 if isinstance(v, bool) else 1 if isinstance(v, int) else 0


def pack(records: list[dict], slots: int) -> bytes:
    """This rank's records of a pass as `slots` fixed-size slots (unused ones all None)."""
    spec = fields()
    if len(records) > slots:
        raise ValueError(f"{len(records)} link records for {slots} slots")
    values = np.zeros((slots, len(spec)), dtype="<f8")
    bits = values.view("<i8")
    bits[:] = _NONE
    for i, rec in enumerate(records):
        for j, (name, kind) in enumerate(spec):
            v = rec.get(name)
            if v is None:
                continue
            values[i, j] = _type_code(v) if kind == "type" else float(v)
    return values.tobytes()


def unpack(data: bytes, *, rank: int, world: int, rounds: range, name: str) -> list[dict]:
    """Rank `rank`'s records from its opened row (`pack`'s), or `Refused` as malformed."""
    spec = fields()
    bits = np.frombuffer(data, dtype="<i8")
    if len(bits) != len(rounds) * len(spec):
        raise _malformed(name, rank, f"{len(data)} bytes, not {len(rounds)} slots")
    bits = bits.reshape(len(rounds), len(spec))
    values = bits.view("<f8")
    out = []
    for slot in range(len(rounds)):
        if bits[slot, 0] == _NONE:
            continue
        rec = {}
        for j, (key, kind) in enumerate(spec):
            if bits[slot, j] == _NONE:
                if kind.endswith("!"):
                    raise _malformed(name, rank, f"slot {slot} has no {key}")
                continue
            v = _value(float(values[slot, j]), "float" if kind == "num" else kind, key, name, rank)
            if kind == "type":  # a carried field's number, back as the type it was
                if key not in rec or v not in range(len(_TYPES)):
                    raise _malformed(name, rank, f"slot {slot}: {key} of no known type")
                v = _value(rec[key], _TYPES[int(v)].__name__, key, name, rank)
            rec[key] = v
        peer, rnd = rec["peer"], rec["round"]
        if not (0 <= peer < world and peer != rank and rnd in rounds and rec["gbps_out"] >= 0):
            raise _malformed(name, rank, f"slot {slot}: peer {peer}, round {rnd}")
        out.append(rec)
    return out


def _value(v: float, kind: str, key: str, name: str, rank: int) -> object:
    if not math.isfinite(v):
        raise _malformed(name, rank, f"{key} is {v}")
    if kind.startswith("int"):
        if v != int(v):
            raise _malformed(name, rank, f"{key} is {v}, not an integer")
        return int(v)
    if kind.startswith("bool"):
        if v not in (0.0, 1.0):
            raise _malformed(name, rank, f"{key} is {v}, not 0 or 1")
        return bool(v)
    return v  # float, or the number of a carried field ("num") or its type ("type")


def _malformed(name: str, rank: int, why: str) -> Refused:
    return Refused("malformed", f"the {name} row gathered from rank {rank}", f"rank {rank}", why)


def open_rows(
    signer: Signer, name: str, rows, *, world: int, rounds: range
) -> tuple[dict[int, list[dict]], dict[int, Refused]]:
    """Rank 0: every rank's records from the gathered rows (an array, a row of bytes per rank),
    and the rows refused (forged or malformed), by rank (`open_batch`, its records as dicts)."""
    batch, refused = open_batch(signer, name, rows, world=world, rounds=rounds)
    return ({} if batch is None else batch.dicts()), refused


def open_batch(
    signer: Signer, name: str, rows, *, world: int, rounds: range
) -> tuple[Batch | None, dict[int, Refused]]:
    """Rank 0: the records of every row not refused as one `Batch` (None: no row could be
    read), and the rows refused (forged or malformed), by rank. Checked for all rows at once
    (numpy): at 64k ranks a row at a time took seconds."""
    refused: dict[int, Refused] = {}
    for r in range(world):
        try:
            collectives.open_bytes(signer, name, r, bytes(rows[r]))
        except Refused as err:
            refused[r] = err
    spec = fields()
    data = np.ascontiguousarray(rows[:, : rows.shape[1] - 32])
    if data.shape[1] != len(rounds) * len(spec) * 8:  # the size every rank derives alike
        bad = np.ones(world, dtype=bool)
        bits = values = none = None
    else:
        bits = data.view("<i8").reshape(world, len(rounds), len(spec))
        values, none = bits.view("<f8"), bits == _NONE
        bad = _bad_rows(values, none, world, rounds)
    for r in np.flatnonzero(bad).tolist():
        if r not in refused:
            try:
                unpack(bytes(data[r]), rank=r, world=world, rounds=rounds, name=name)
            except Refused as err:
                refused[r] = err
            else:
                refused[r] = _malformed(name, r, "not readings")
    if values is None:
        return None, refused
    ok = [r for r in range(world) if r not in refused]
    mine, unset_ok = values[ok], none[ok]
    return Batch(_columns(mine, unset_ok, ok), lambda: _dicts(mine, unset_ok, ok)), refused


def _dicts(values, none, ok: list[int]) -> dict[int, list[dict]]:
    """Each rank's (of `ok`) records as dicts, from its checked slots."""
    spec = fields()
    names, typed = _typed(values, none, spec)
    first = [names.index(key) for key, _ in spec]  # each field's column
    unset = np.zeros(typed.shape[:2], dtype=np.int64)  # per slot: a bit per unset column
    for j, col in enumerate(first):
        if j == 0 or spec[j - 1][0] != spec[j][0]:  # a carried field's type: its number's bit
            unset |= none[:, :, j].astype(np.int64) << col
    keep: dict = {}
    got: dict[int, list[dict]] = {}
    for r, rows_typed, pattern in zip(ok, typed.tolist(), unset.tolist(), strict=True):
        got[r] = _records(names, rows_typed, pattern, keep)
    return got


def _columns(values, none, ok: list[int]) -> dict:
    """The used slots of the ranks `ok` as the columns a `records.Batch` holds (rank then slot
    order, as `_dicts` lists them), each field's absent value as a record's reader takes it."""
    spec = fields()
    at = {key: j for j, (key, kind) in reversed(list(enumerate(spec))) if kind != "type"}
    used = np.flatnonzero(~none[:, :, 0].reshape(-1))  # the slots with a peer, rank by rank
    ri = used // none.shape[1]
    v = values.reshape(-1, values.shape[2])[used]
    unset = none.reshape(-1, none.shape[2])[used]

    def col(key: str, absent: float) -> np.ndarray:
        return np.where(unset[:, at[key]], absent, v[:, at[key]])

    g = v[:, at["gbps_out"]].copy()
    cols: dict = {
        "rank": np.asarray(ok, dtype=np.int64)[ri],
        "peer": v[:, at["peer"]].astype(np.int64),
        "round": v[:, at["round"]].astype(np.int64),
        "intra": v[:, at["intra"]] != 0,
        "g": g,
        "low": np.where(unset[:, at["gbps_low_out"]], g, v[:, at["gbps_low_out"]]),
        "starved": col("starved", 0.0),
        "ceiling": col("gbps_ceiling_out", np.nan),
        "known": col("cpu_wait_known", 0.0) != 0,
    }
    for key in ("reps", "starved_reps", "extra_reps"):
        cols[key] = col(key, 0.0).astype(np.int64)
    for name in measure.carried():  # as the type it was: float, int or bool (`_TYPES`)
        j = at[name]
        nums = v[:, j].tolist()
        if (v[:, j + 1] == 0).all() and not unset[:, j].any():  # every one a float: as it is
            cols["carried:" + name] = nums
            continue
        kinds, gone = v[:, j + 1].tolist(), unset[:, j].tolist()
        cols["carried:" + name] = [
            None if u else x if k == 0 else int(x) if k == 1 else x != 0
            for x, k, u in zip(nums, kinds, gone, strict=True)
        ]
    return cols


def _bad_rows(values, none, world: int, rounds: range):
    """Per rank: whether a slot in use holds something that is not a reading (`unpack` names
    what)."""
    spec = fields()
    used = ~none[:, :, 0]
    bad = np.zeros(used.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        for j, (_, kind) in enumerate(spec):
            v, unset = values[:, :, j], none[:, :, j]
            ok = np.isfinite(v)
            if kind.startswith(("int", "type")):
                ok &= v == np.floor(v)
            if kind.startswith("bool"):
                ok &= (v == 0) | (v == 1)
            if kind == "type":
                num = values[:, :, j - 1]
                ok &= (v >= 0) & (v < len(_TYPES)) & ~none[:, :, j - 1]
                ok &= (v != 1) | (num == np.floor(num))
                ok &= (v != 2) | (num == 0) | (num == 1)
            bad |= unset if kind.endswith("!") else ~(ok | unset)
        peer, rnd, gbps = values[:, :, 0], values[:, :, 1], values[:, :, 3]
        me = np.arange(world)[:, None]
        ok = (peer >= 0) & (peer < world) & (peer != me) & (gbps >= 0)
        ok &= (rnd >= rounds.start) & (rnd < rounds.stop)
        bad |= ~ok
    return (bad & used).any(axis=1)


def _typed(values, none, spec):
    """Rank-by-slot rows of the fields' Python values (an object array, one column per
    distinct field name, in `spec`'s order), each converted once per column by numpy rather
    than once per value: a carried field back as the type it was (`_TYPES`)."""
    names = list(dict.fromkeys(key for key, _ in spec))
    out = np.empty((*values.shape[:2], len(names)), dtype=object)
    with np.errstate(invalid="ignore"):
        for j, (key, kind) in enumerate(spec):
            col, v = names.index(key), values[:, :, j]
            if kind == "type":  # checked (`_bad_rows`): 0, 1 or 2 where the number is set
                num = values[:, :, j - 1]
                as_int, as_bool = v == 1, v == 2
                out[:, :, col][as_int] = num[as_int].astype(np.int64).astype(object)
                out[:, :, col][as_bool] = (num[as_bool] != 0).astype(object)
            elif kind[0] == "i":
                out[:, :, col] = np.where(none[:, :, j], 0, v).astype(np.int64).astype(object)
            elif kind[0] == "b":
                out[:, :, col] = (v != 0).astype(object)
            else:
                out[:, :, col] = v.astype(object)
    return names, out


def _records(names: list[str], typed: list, unset: list, keep: dict) -> list[dict]:
    """One rank's records from its checked slots (`_typed`'s rows, plain lists), each with the
    fields its slot sets; `keep`: per pattern of unset fields, a getter of the set ones."""
    out = []
    for row, pattern in zip(typed, unset, strict=True):
        if pattern & 1:  # no peer: an unused slot
            continue
        got = keep.get(pattern)
        if got is None:
            kept = [j for j in range(len(names)) if not pattern >> j & 1]
            got = keep[pattern] = ([names[j] for j in kept], itemgetter(*kept))
        out.append(dict(zip(got[0], got[1](row), strict=True)))
    return out


@dataclass
class Plan:
    """What rank 0 broadcasts after a pass: the next pass's rounds (none: the stage ends), or
    an abort (`refused`: how many ranks' rows were refused, the first `ABORT_NAMED` named)."""

    rounds: list[list[tuple[int, int]]] = field(default_factory=list)
    refused: int = 0
    named: list[int] = field(default_factory=list)

    def ints(self) -> list[int]:
        if self.refused:
            return [_ABORT, self.refused, len(self.named), *self.named]
        out = [_ROUNDS if self.rounds else _END, len(self.rounds)]
        for rnd in self.rounds:
            out += [len(rnd), *(e for pair in rnd for e in pair)]
        return out

    @classmethod
    def of(cls, ints: list[int]) -> Plan:
        if ints[0] == _ABORT:
            return cls(refused=ints[1], named=ints[3 : 3 + ints[2]])
        rounds, at = [], 2
        for _ in range(ints[1]):
            k = ints[at]
            flat = ints[at + 1 : at + 1 + 2 * k]
            rounds.append(list(zip(flat[::2], flat[1::2], strict=True)))
            at += 1 + 2 * k
        return cls(rounds=rounds)


def plan_ints(nodes: int, rounds: int) -> int:
    """The integers a broadcast plan takes (every rank sizes it alike): `rounds` rounds of at
    most nodes/2 pairs, or an abort."""
    return max(2 + rounds * (1 + 2 * (nodes // 2)), 3 + ABORT_NAMED)


@dataclass
class Exchange:
    """One rank's side of the passes' gathers and rank 0's broadcasts; on rank 0 `records`,
    every rank's records of the passes closed so far."""

    dist: object
    torch: object
    device: object
    signer: Signer
    rank: int
    world: int
    records: Records = field(default_factory=Records)

    def close(self, name: str, mine: list[dict], rounds: range, decide, plan_size: int) -> Plan:
        """The pass `name` (its `rounds`) ends: every rank's row to rank 0, which opens them
        and broadcasts `decide(records so far)` (an abort where a row was refused: raised
        there, `Failed` on the others)."""
        sealed = collectives.seal_bytes(self.signer, name, self.rank, pack(mine, len(rounds)))
        rows = self._gather(sealed, name)
        plan = None
        refused: dict[int, Refused] = {}
        if rows is not None:
            with gc_paused():  # rank 0: every rank's records, then the decision (`bulk`)
                plan, refused = self._open(name, rows, rounds, decide)
        plan = self._broadcast(plan, name, plan_size)
        if refused:  # a forged or malformed row: every rank ends, rank 0 names it
            raise next(iter(refused.values()))
        if plan.refused:
            raise Failed(f"rank 0 refused the {name} rows of ranks {ranges(plan.named)}")
        return plan

    def _open(self, name: str, rows, rounds: range, decide) -> tuple[Plan, dict[int, Refused]]:
        """Rank 0: the rows opened into `records`, and the plan (an abort where refused)."""
        batch, refused = open_batch(self.signer, name, rows, world=self.world, rounds=rounds)
        if batch is not None:
            self.records.add(batch)
        named = sorted(refused)
        if refused:
            return Plan(refused=len(named), named=named[:ABORT_NAMED]), refused
        return Plan(rounds=[list(rnd) for rnd in decide(self.records)]), refused

    def _gather(self, sealed: bytes, name: str):
        torch = self.torch
        mine = torch.frombuffer(bytearray(sealed), dtype=torch.uint8).to(self.device)
        out = rows = None
        if self.rank == 0:
            rows = torch.empty((self.world, len(sealed)), dtype=torch.uint8, device=self.device)
            out = list(rows.unbind(0))
        try:
            self.dist.gather(mine, out, dst=0)
        except Exception as err:
            raise Failed(f"gathering the {name} rows: {first_line(err, 300)}") from None
        return None if rows is None else rows.cpu().numpy()

    def _broadcast(self, plan: Plan | None, name: str, size: int) -> Plan:
        torch, what = self.torch, f"{name} plan"
        if plan is not None:
            ints = plan.ints()
            if len(ints) > size:
                raise ValueError(f"a plan of {len(ints)} integers for {size}")
            data = struct.pack(f"<{size}q", *ints, *[0] * (size - len(ints)))
            sealed = collectives.seal_bytes(self.signer, what, 0, data)
            tensor = torch.frombuffer(bytearray(sealed), dtype=torch.uint8).to(self.device)
        else:
            tensor = torch.zeros(size * 8 + 32, dtype=torch.uint8, device=self.device)
        try:
            self.dist.broadcast(tensor, src=0)
        except Exception as err:
            doing = f"sending the {what}" if plan is not None else f"waiting for rank 0's {what}"
            raise Failed(f"{doing}: {first_line(err, 300)}") from None
        if plan is not None:
            return plan
        data = collectives.open_bytes(self.signer, what, 0, tensor.cpu().numpy().tobytes())
        return Plan.of(list(struct.unpack(f"<{size}q", data)))
