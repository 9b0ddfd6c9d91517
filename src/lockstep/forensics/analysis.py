"""Who is out of step in a hung or crashed run, from each rank's flight-recorder dump. Pure:
dicts in (`dumps.loads`), a `Report` out. Design: docs/design/forensics.md.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from lockstep.forensics.bounds import shown

NOT_REACHED = "not reached"


@dataclass
class Group:
    ranks: list[int]
    op: str  # the collective, or NOT_REACHED
    input_sizes: list | None = None
    input_dtypes: list | None = None
    output_sizes: list | None = None
    output_dtypes: list | None = None
    waiting: bool = False  # entered and not completed

    def describe(self) -> str:
        if self.op == NOT_REACHED:
            return "no collective pending (in Python)"
        sizes = f"in {sizes_text(self.input_sizes, self.input_dtypes)}"
        if self.output_sizes and self.output_sizes != self.input_sizes:
            sizes += f", out {sizes_text(self.output_sizes, self.output_dtypes)}"
        return f"{self.op} ({sizes})"


@dataclass
class Finding:
    process_group: str
    seq: int
    groups: list[Group]
    odd: list[int]
    majority: list[int]
    headline: str
    kind: str  # "different collective", "skipped", "in Python", "sizes differ", "no dump", ...
    stacks: dict[int, str] = field(default_factory=dict)


@dataclass
class Report:
    findings: list[Finding]
    no_dump: list[int]
    versions: dict[int, str]
    problems: list[str] = field(default_factory=list)
    # Ranks whose dump holds no collective at all: nothing of theirs was compared.
    empty: list[int] = field(default_factory=list)
    dead = ""  # not a field: why the reader gave no report (`hang.report`)

    @property
    def judged(self) -> bool:
        """False when every dump read was empty: nothing was compared."""
        return bool(self.findings) or len(self.empty) < len(self.versions)

    def lines(self) -> list[str]:
        out = []
        for f in self.findings:
            out.append(f"{f.headline} (process group {f.process_group})")
            for g in f.groups:
                out.append(f"  {ranks_text(g.ranks)}: {g.describe()}")
            for rank, stack in sorted(f.stacks.items()):
                out.append(f"  rank {rank}'s Python stack:")
                out.extend(f"    {ln}" for ln in stack.splitlines())
        if self.no_dump:
            out.append(f"no dump from {ranks_text(self.no_dump)} (dead, or never answered)")
        if not self.judged:
            out.append(
                f"not judged: the dumps of {ranks_text(self.empty)} hold no collective (is the "
                "flight recorder on? TORCH_FR_BUFFER_SIZE > 0; under NCCL its entries are in "
                "NCCL's own recorder, torch._C._distributed_c10d._dump_nccl_trace)"
            )
        elif not self.findings:
            out.append("no collective out of step in the dumps")
        out.extend(f"unread: {p}" for p in self.problems)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def analyse(dumps: dict[int, dict], *, stacks: dict[int, str] | None = None,
            world: int | None = None, problems: list[str] | None = None,
            clock=None) -> Report:  # fmt: skip
    """The report for `dumps` (rank -> a dump's dict); `world`: ranks expected (0..world-1);
    `clock()` raises past a deadline."""
    stacks, clock = stacks or {}, clock or (lambda: None)
    groups: dict[str, dict[int, _RankView]] = {}
    members: dict[str, set[int]] = {}
    for rank, data in dumps.items():
        for name, view in _views(data, clock).items():
            groups.setdefault(name, {})[rank] = view
        for name, config in (data.get("pg_config") or {}).items():
            clock()
            members.setdefault(_pg_key(name, config), set()).update(_parse_ranks(config))
    expected = set(range(world)) if world else set()
    for ranks in members.values():
        expected |= ranks
    no_dump = sorted(expected - set(dumps))
    findings = []
    for name, views in sorted(groups.items()):
        _completed_by_peers(views, clock)
        found = _finding(name, views, clock)
        if found:
            found.stacks = {r: _main_stack(stacks[r]) for r in found.odd if stacks.get(r)}
            findings.append(found)
    if no_dump and findings:
        for f in findings:
            f.headline += f"; no dump from {ranks_text(no_dump)}"
    clock()
    versions = {r: str(d.get("version", "unknown")) for r, d in sorted(dumps.items())}
    empty = [r for r, d in sorted(dumps.items()) if not d.get("entries")]
    return Report(findings, no_dump, versions, problems or [], empty)


@dataclass
class _RankView:
    entries: dict[int, dict]  # collective seq -> entry
    completed: int  # last completed seq
    last: int  # last entered seq

    def pending(self) -> int | None:
        return self.completed + 1 if self.last > self.completed else None


def _pg_key(name, config) -> str:
    desc = config.get("desc", "") if isinstance(config, dict) else ""
    return f"{shown(name, 200)} ({shown(desc, 200)})" if desc else shown(name, 200)


def _views(data: dict, clock) -> dict[str, _RankView]:
    status = data.get("pg_status") or {}
    by_pg: dict[str, dict[int, dict]] = {}
    names: dict[str, str] = {}
    for e in data.get("entries") or []:
        clock()
        if e.get("is_p2p") or not e.get("collective_seq_id"):
            continue
        pg = e.get("process_group") or (str(e.get("pg_id", 0)), "")
        key = _pg_key(pg[0], {"desc": pg[1] if len(pg) > 1 else ""})
        names[key] = str(pg[0])
        by_pg.setdefault(key, {})[int(e["collective_seq_id"])] = e
    views = {}
    for key, entries in by_pg.items():
        clock()
        st = status.get(names[key]) or status.get(str(next(iter(entries.values())).get("pg_id")))
        last = max(entries)
        done = [s for s, e in entries.items() if e.get("state") == "completed"]
        if st and "last_completed_collective" in st:
            # NCCL's pg_status can lag its entries' own states; a group's collectives finish in order
            completed = max(int(st["last_completed_collective"]), max(done, default=-1))
            last = max(last, int(st.get("last_enqueued_collective", last)))
        else:  # older dumps: no pg_status
            completed = max(done, default=min(entries) - 1)
        views[key] = _RankView(entries, max(completed, 0), last)
    return views


# Collectives whose result on any rank needs every rank's part (not the rooted ones, whose root
# can complete while another rank still waits).
SYMMETRIC = frozenset({
    "all_reduce", "allreduce", "all_gather", "allgather", "_allgather_base",
    "all_gather_into_tensor", "allgather_into_tensor_coalesced", "reduce_scatter",
    "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
    "all_to_all", "alltoall", "alltoall_base", "barrier",
})  # fmt: skip


def _completed_by_peers(views: dict[int, _RankView], clock) -> None:
    """A rank's completed count raised through the symmetric collectives a peer completed
    (gloo's status can lag)."""
    done: dict[int, set[str]] = {}  # seq -> the ops some rank completed there
    for view in views.values():
        for seq, entry in view.entries.items():
            clock()
            if seq <= view.completed:
                done.setdefault(seq, set()).add(_op(entry))
    for view in views.values():  # a rank past its own completed count: only peers' are there
        seq = view.completed + 1
        while seq <= view.last and seq in view.entries:
            clock()
            op = _op(view.entries[seq])
            if op not in SYMMETRIC or op not in done.get(seq, ()):
                break
            view.completed = seq
            seq += 1


def _op(entry: dict) -> str:
    name = str(entry.get("profiling_name", "?"))[:400]  # one string, many entries: cut first
    return shown(name.split(":", 1)[1] if ":" in name else name, 200)


def _signature(entry: dict) -> tuple:
    return (_op(entry), json.dumps(entry.get("input_sizes")), json.dumps(entry.get("input_dtypes")),
            json.dumps(entry.get("output_sizes")), json.dumps(entry.get("output_dtypes")))  # fmt: skip


def _finding(name: str, views: dict[int, _RankView], clock) -> Finding | None:
    fronts = {r: (v.pending() or v.last + 1) for r, v in views.items()}
    seq = min(fronts.values())
    parted = _first_disagreement(views, min(v.last for v in views.values()) + 1, clock)
    if parted is not None:
        seq = parted  # the first collective the ranks did not agree on, pending or not
    elif not any(v.pending() for v in views.values()):
        return None  # nobody waits in this group, and every collective agreed
    by_sig: dict[tuple, list[int]] = {}
    entry_of: dict[tuple, dict] = {}
    for rank, view in sorted(views.items()):
        clock()
        entry = view.entries.get(seq)
        if entry is None:
            sig = (NOT_REACHED,) if view.last < seq else ("unknown",)
        else:
            sig = _signature(entry)
            entry_of[sig] = entry
        by_sig.setdefault(sig, []).append(rank)
    groups = []
    for sig, ranks in by_sig.items():
        e = entry_of.get(sig)
        if e is None:
            groups.append(Group(ranks, sig[0]))
        else:
            waiting = all(views[r].completed < seq for r in ranks)
            groups.append(Group(ranks, _op(e), e.get("input_sizes"), e.get("input_dtypes"),
                                e.get("output_sizes"), e.get("output_dtypes"), waiting))  # fmt: skip
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks))
    if len(groups) == 1:
        g = groups[0]
        return Finding(name, seq, groups, [], g.ranks,
                       f"{ranks_text(g.ranks)} {_verb('wait in', g)} {g.op} #{seq}", "all waiting")  # fmt: skip
    predicted = _predicted(views, seq, clock)
    major = _majority(groups, predicted)
    odd = sorted(r for g in groups if g is not major for r in g.ranks)
    minors = [g for g in groups if g is not major]
    verb = "wait in" if major.waiting else "entered"
    if major.op == NOT_REACHED:
        where = f"have no collective pending at #{seq} (in Python)"
    else:
        where = f"{verb} {major.op} #{seq}"
    parts, kinds = [], []
    for g in minors:
        if g.op == NOT_REACHED:
            last = max(views[r].last for r in g.ranks)
            parts.append(f"{ranks_text(g.ranks)} never reached #{seq} (last collective #{last}, "
                         "none pending: in Python)")  # fmt: skip
            kinds.append("in Python")
        elif g.op == major.op:
            parts.append(f"{ranks_text(g.ranks)} entered {g.op} #{seq} with "
                         f"{sizes_text(g.input_sizes, g.input_dtypes)}")  # fmt: skip
            kinds.append("sizes differ")
            where = (
                f"{verb} {major.op} #{seq} with {sizes_text(major.input_sizes, major.input_dtypes)}"
            )
        elif predicted and predicted[0] == major.op and predicted[1] == g.op:
            parts.append(f"{ranks_text(g.ranks)} skipped {major.op} #{seq}: entered {g.op}, "
                         "the collective after it")  # fmt: skip
            kinds.append("skipped")
        else:
            parts.append(f"{ranks_text(g.ranks)} entered {g.op} #{seq}")
            kinds.append("different collective")
    headline = f"{'; '.join(parts)} while {ranks_text(major.ranks)} {_verb(where, major)}"
    if len(major.ranks) == len(odd) and not _broke_tie(groups, major, predicted):
        each = "; ".join(f"{ranks_text(g.ranks)}: {g.describe()}" for g in groups)
        headline = f"no majority at #{seq}, out of step with each other: {each}"
        odd = sorted(views)
    return Finding(name, seq, groups, odd, major.ranks, headline, ", ".join(dict.fromkeys(kinds)))


def last_agreed(dumps: dict[int, dict], clock=lambda: None) -> tuple[str, int, Group] | None:
    """(process group, seq, Group) of the last collective all `dumps` entered alike, or None."""
    groups: dict[str, dict[int, _RankView]] = {}
    for rank, data in dumps.items():
        for name, view in _views(data, clock).items():
            groups.setdefault(name, {})[rank] = view
    for name, views in sorted(groups.items()):
        if len(views) != len(dumps):
            continue
        _completed_by_peers(views, clock)
        seq = min(v.last for v in views.values())
        entries = [v.entries.get(seq) for v in views.values()]
        if any(e is None for e in entries) or len(_signatures(entries, clock)) != 1:
            continue
        e = entries[0]
        done = all(v.completed >= seq for v in views.values())
        return name, seq, Group(sorted(views), _op(e), e.get("input_sizes"),
                                e.get("input_dtypes"), e.get("output_sizes"),
                                e.get("output_dtypes"), not done)  # fmt: skip
    return None


def _first_disagreement(views: dict[int, _RankView], before: int, clock) -> int | None:
    """The first sequence number below `before` whose entries differ between ranks, among
    those every rank holds (never a range: they may jump by 10**15)."""
    if len(views) < 2:
        return None
    start = max(min(v.entries) for v in views.values())
    held = sorted({s for v in views.values() for s in v.entries if start <= s < before})
    for s in held:
        if len(_signatures([v.entries.get(s) for v in views.values()], clock)) > 1:
            return s
    return None


def _signatures(entries: list, clock) -> set[tuple]:
    """The distinct signatures of `entries` (None: none), the clock read before each one."""
    sigs = set()
    for e in entries:
        clock()
        if e is not None:
            sigs.add(_signature(e))
    return sigs


def _verb(where: str, group: Group) -> str:
    """`where` for one rank: "waits in", "has"."""
    if len(group.ranks) != 1:
        return where
    for plural, single in (("wait in", "waits in"), ("have ", "has "), ("entered", "entered")):
        if where.startswith(plural):
            return single + where[len(plural) :]
    return where


def _predicted(views: dict[int, _RankView], seq: int, clock) -> tuple[str, str | None] | None:
    """From the history every rank agrees on: the op expected at `seq` (what followed the op
    at seq-1 last time) and the op after that."""
    common = {}
    for s in range(seq - 1, 0, -1):
        clock()
        ops = {_op(v.entries[s]) if s in v.entries else None for v in views.values()}
        if len(ops) != 1 or None in ops:
            break
        common[s] = ops.pop()
    if seq - 1 not in common:
        return None
    prev = common[seq - 1]
    for t in range(seq - 2, 0, -1):
        clock()
        if t not in common:
            break
        if common[t] == prev:
            return common[t + 1], common.get(t + 2)
    return None


def _majority(groups: list[Group], predicted) -> Group:
    top = [g for g in groups if len(g.ranks) == len(groups[0].ranks)]
    if len(top) == 1:
        return top[0]
    if predicted:
        match = [g for g in top if g.op == predicted[0]]
        if len(match) == 1:
            return match[0]
    waiting = [g for g in top if g.waiting]
    if len(waiting) == 1 and any(g.op == NOT_REACHED for g in top):
        return waiting[0]  # they wait for the ranks that never came
    return top[0]


def _broke_tie(groups, major, predicted) -> bool:
    top = [g for g in groups if len(g.ranks) == len(major.ranks)]
    if len(top) == 1:
        return True
    if predicted and sum(g.op == predicted[0] for g in top) == 1 and major.op == predicted[0]:
        return True
    return major.waiting and any(g.op == NOT_REACHED for g in top) and len(top) == 2


def _main_stack(text: str) -> str:
    """faulthandler's dump without lockstep's own threads and frames, at most 20 lines,
    escaped."""
    blocks = [b for b in text.split("\n\n") if b.strip() and "in _watch" not in b
              and "launch/cleanup.py" not in b]  # fmt: skip
    blocks = [b for b in blocks if "excepthook" not in b] or blocks  # the Traceback says it
    lines = [
        ln for b in blocks for ln in b.strip().splitlines()
        if not ln.startswith("# ") and "lockstep/forensics" not in ln
    ]  # fmt: skip
    return "\n".join(shown(ln, 300) for ln in lines[:20])


def sizes_text(sizes, dtypes) -> str:
    shapes = ", ".join(str(list(s)) for s in (sizes or []))
    types = ", ".join(shown(t, 40) for t in sorted(set(dtypes or [])))
    return f"{shapes} {types}".strip()


def ranks_text(ranks: list[int], most: int = 16) -> str:
    """ "rank 3", "ranks 0-3", "ranks 0, 2, 5"; past `most` ranks, the first ones and how many."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and len(ranks) == ranks[-1] - ranks[0] + 1:  # consecutive
        return f"ranks {ranks[0]}-{ranks[-1]}"
    if len(ranks) > most:
        return f"ranks {', '.join(map(str, ranks[:most]))}, ... ({len(ranks)} ranks)"
    return "ranks " + ", ".join(map(str, ranks))


def _parse_ranks(config) -> set[int]:
    """A process group's ranks (`dumps.checked` made them a list; torch writes "[0, 1]")."""
    raw = config.get("ranks") if isinstance(config, dict) else None
    if isinstance(raw, str):
        raw = [int(r) for r in re.findall(r"\d+", raw) if len(r) < 8]
    return {r for r in raw or [] if type(r) is int and r >= 0}


def counts(report: Report) -> Counter:
    return Counter(f.kind for f in report.findings)
