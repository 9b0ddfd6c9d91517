"""What a failed preflight asks of the scheduler: each problem is a node's or the job's.

A **node** problem is the state of a machine (its GPUs, driver, /dev/shm, network, a package
installed differently there, a slow node or link): drain or exclude that host, the job itself is
fine elsewhere. A **job** problem is what the job brought (its lock, image, environment, launch
layout): fix the job and keep the nodes, since moving it leaves the problem in place. The rule
(docs/slurm.md, "Node or job"):

- what is measured on hardware (a slow node or link, a node that dropped out, wrong collective
  values, an odd matmul checksum) and the node-state checks are node problems on the hosts named;
- anything found on every host of a job of two or more hosts is the job's (the same everywhere:
  its image or settings, never a reason to drain the whole allocation);
- fingerprint drift is a node's when the differing ranks are whole hosts that hold no rank of
  the majority (a node's state is the same for all its ranks), the job's when ranks of one host
  differ (what the launch gave them) or when no majority says which side is odd;
- a lock not matched by the majority, ranks sharing a GPU, and the all_reduce floor missed on the
  whole allocation are the job's.

Each node problem carries a `reason` for Slurm's `Reason=` with the stable prefix `lockstep: `.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lockstep.launch.hostlist import compress

NODE, JOB = "node", "job"
PREFIX = "lockstep: "
JOB_CHECKS = frozenset({"gpu_assignment", "master_addr"})  # the launch's settings, not a node's
_REASONS_SHOWN = 3


def reason(text: str) -> str:
    """`lockstep: slow link ls1<->ls3`: one line, the prefix an operator greps for."""
    return PREFIX + " ".join(text.split())


def spread_kind(hosts: Iterable[str], all_hosts: Iterable[str], default: str = NODE) -> str:
    """The job's when `hosts` are every host of a job on two or more hosts, else `default`."""
    everywhere = set(all_hosts)
    return JOB if len(everywhere) > 1 and set(hosts) >= everywhere else default


def check_kind(name: str, hosts: Sequence[str], all_hosts: Sequence[str]) -> str:
    """A failed local check: the launch's own settings are the job's; a node-state check is the
    node's unless it fails on every host."""
    return spread_kind(hosts, all_hosts, JOB if name in JOB_CHECKS else NODE)


def drift_kind(ranks: Iterable[int], identities: Sequence[dict], majority: Iterable[int]) -> str:
    """Ranks that differ from the majority: a node's when no rank of the majority shares their
    hosts (whole hosts differ), the job's when ranks of one host disagree."""
    hosts = {identities[r]["host"] for r in ranks}
    mixed = any(identities[r]["host"] in hosts for r in majority)
    return JOB if mixed else NODE


@dataclass
class Problems:
    """The report's problems in order, each with its finding, kind, hosts and Slurm reason."""

    lines: list[str] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)

    def add(
        self,
        line: str,
        finding: str,
        kind: str,
        hosts: Iterable[str] = (),
        why: str | None = None,
    ) -> None:
        named = sorted(set(hosts)) if kind == NODE else []
        self.lines.append(line)
        self.entries.append(
            {
                "problem": line,
                "finding": finding,
                "kind": kind,
                "hosts": named,
                "reason": reason(why) if kind == NODE and why else None,
            }
        )

    def extend(self, entries: Iterable[dict]) -> None:
        for entry in entries:
            self.lines.append(entry["problem"])
            self.entries.append(entry)


def overall(entries: Sequence[dict]) -> str | None:
    """The report's `kind`: `job` when any problem is the job's (excluding nodes cannot make it
    start), else `node` when any is a node's, else None."""
    kinds = {e["kind"] for e in entries}
    return JOB if JOB in kinds else NODE if NODE in kinds else None


def drain(entries: Sequence[dict]) -> list[dict]:
    """One {host, reason} per host a node problem names, in the order first named; a host named
    by several problems gets their reasons joined (`; `), the first few shown."""
    reasons: dict[str, list[str]] = {}
    for e in entries:
        if e["kind"] != NODE:
            continue
        for host in e["hosts"]:
            mine = reasons.setdefault(host, [])
            if e["reason"] and e["reason"] not in mine:
                mine.append(e["reason"])
    out = []
    for host, rs in reasons.items():
        texts = [r.removeprefix(PREFIX) for r in rs[:_REASONS_SHOWN]]
        more = f" and {len(rs) - _REASONS_SHOWN} more" if len(rs) > _REASONS_SHOWN else ""
        out.append({"host": host, "reason": reason("; ".join(texts) + more)})
    return out


def scheduler_keys(entries: Sequence[dict]) -> dict:
    """The report's keys for the scheduler: `kind`, `problem_kinds`, `drain`, `drain_hostlist`."""
    hosts = drain(entries)
    return {
        "kind": overall(entries),
        "problem_kinds": list(entries),
        "drain": hosts,
        "drain_hostlist": compress([h["host"] for h in hosts]) if hosts else "",
    }
