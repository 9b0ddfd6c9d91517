"""The preflight's verdict, from plain data: no processes, no process group, no torch.

Rank 0 gathers what every rank found (its identity with its local checks, its measurements)
and the comparison of fingerprints (`compare.compare_ranks`); `build_report` turns them into
the report: every finding, the one-line problems that make it fail, and the one line that says
what a passing preflight compared. How the data travels between ranks is `rank`'s part.

A rank's measurements are a dict:
    {"collectives": {"all_reduce": True, ...}, "allreduce_seconds": [s per size, ...],
     "matmul_checksum": int or None (no GPU)}
"""

from __future__ import annotations

from lockstep.env.lockfile import describe as describe_lock
from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT
from lockstep.preflight.collectives import COLLECTIVES, busbw_gbps
from lockstep.preflight.lines import ranges
from lockstep.preflight.problem_kind import (
    JOB,
    NODE,
    Problems,
    check_kind,
    drift_kind,
    scheduler_keys,
    spread_kind,
)

# 2: `kind` is node/job everywhere (links' finding names: `finding`); 3: the JSON's rank sets as
# ranges, a sampled link schedule's rows cut to the named and the slowest (`report_json`)
REPORT_SCHEMA = 3
_FIELDS_SHOWN = 5
_HOSTS_SHOWN = 3


def build_report(
    *,
    launcher: str,
    backend: str,
    identities: list[dict],
    comparison: dict,
    fingerprints: dict[int, dict],
    measurements: list[dict],
    sizes: tuple[int, ...] | list[int],
    min_busbw: float | None = None,
    lock_required: bool = False,
    links: dict | None = None,
) -> dict:
    """Rank 0's verdict; `identities` and `measurements` are indexed by rank; `links`: the link
    stage's section (`links.verdict.assess`), or None when it did not run."""
    found = Problems()
    warnings: list[str] = []
    checks = merge_checks(identities)
    all_hosts = sorted({i["host"] for i in identities})
    for check in checks:
        line = check_line(check, identities)
        if check["status"] == "fail":
            hosts = _hosts(check["ranks"], identities)
            kind = check_kind(check["name"], hosts, all_hosts)
            found.add(line, "check", kind, hosts, f"{check['name']} check failed")
        elif check["status"] == "warn":
            warnings.append(line)
    _comparison_lines(comparison, fingerprints, identities, lock_required, found, warnings)
    coll = collectives(measurements)
    for name, c in coll.items():
        if c["failed_ranks"]:
            hosts = _hosts(c["failed_ranks"], identities)
            found.add(
                f"{name} returned wrong values on rank {ranges(c['failed_ranks'])}",
                "collectives",
                spread_kind(hosts, all_hosts),
                hosts,
                f"wrong {name} values",
            )
    bw = bandwidth(measurements, sizes, min_busbw)
    if bw.get("below_min"):  # the whole allocation's rate: no node to name (the links do)
        found.add(bw["below_min"], "busbw", JOB)
    mm = matmul(measurements, identities)
    if mm["status"] == "fail":
        hosts = _hosts(mm["odd_ranks"], identities)
        found.add(mm["detail"], "matmul", NODE, hosts, "matmul checksum differs (GPU)")
    problems = found.lines
    result = {
        "schema": REPORT_SCHEMA,
        "ok": not problems,
        "exit_code": EXIT_FAIL if problems else EXIT_OK,
        "launcher": launcher,
        "backend": backend,
        "world_size": len(identities),
        "compared": compared_line(comparison, fingerprints),
        "nodes": nodes(identities, addresses=True),
        "problems": problems,
        "failed_hosts": failed_hosts(identities, checks, comparison, coll, mm),
        "warnings": warnings,
        "checks": checks,
        "comparison": comparison,
        "collectives": coll,
        "bandwidth": bw,
        "matmul": mm,
        "fingerprints": {str(rank): fp for rank, fp in fingerprints.items()},
    }
    return with_findings(result, links, found.entries)


def _comparison_lines(
    comparison: dict,
    fingerprints: dict[int, dict],
    identities: list[dict],
    lock_required: bool,
    found: Problems,
    warnings: list[str],
) -> None:
    """The fingerprint comparison's findings: outliers, shared GPUs, a lock not matched (a
    problem with --lock, else a warning). Kinds: `problem_kind`'s rule."""
    tied = tied_groups(comparison)
    majority = comparison["majority"]
    if tied:  # no majority says which side is odd: nothing to drain
        first = [identities[r] for r in tied[0]]
        found.add(tie_line(first, comparison["outliers"][: len(tied) - 1]), "drift", JOB)
    for outlier in comparison["outliers"][max(len(tied) - 1, 0) :]:
        ranks = [i["rank"] for i in outlier["ranks"]]
        hosts = _hosts(ranks, identities)
        names = [f["field"] for f in outlier["fields"]]
        found.add(
            outlier_line(outlier, majority if tied else None),
            "drift",
            JOB if tied else drift_kind(ranks, identities, majority),
            hosts,
            f"differs from the other nodes in {_fields_shown(names, 3)}",
        )
    for dup in comparison["duplicate_gpus"]:
        line = (
            f"Duplicate GPU: ranks {ranges(dup['ranks'])} share GPU {dup['uuid']} on {dup['host']}"
        )
        found.add(line, "drift", JOB)  # the launch's device mapping
    for group in comparison["groups"]:
        lock = _lock(fingerprints[group[0]])
        if lock and not lock["matches"]:
            line = (
                f"installed packages do not match {lock['path']} on rank {ranges(group)}: "
                + describe_lock(lock)
            )
            if not lock_required:
                warnings.append(line)
                continue
            odd = group is not comparison["groups"][0] and not tied
            kind = drift_kind(group, identities, majority) if odd else JOB
            why = "installed packages differ from the job's lock"
            found.add(line, "lock", kind, _hosts(group, identities), why)


def _hosts(ranks: list[int], identities: list[dict]) -> list[str]:
    by_rank = {i["rank"]: i["host"] for i in identities}
    return sorted({by_rank[r] for r in ranks if r in by_rank})


def collectives(measurements: list[dict]) -> dict[str, dict]:
    """Per collective: whether every rank got the right values, and the ranks that did not."""
    out = {}
    for name in COLLECTIVES:
        failed = [r for r, m in enumerate(measurements) if not m["collectives"][name]]
        out[name] = {"ok": not failed, "failed_ranks": failed}
    return out


def nodes(identities: list[dict], addresses: bool = False) -> list[dict]:
    """The report's nodes, ordered by their first rank: node index, host, ranks, and with
    `addresses` the addresses its ranks reach MASTER_ADDR from (where known)."""
    ranks: dict[tuple, list[int]] = {}
    seen: dict[tuple, list[str]] = {}
    for ident in identities:
        ranks.setdefault((ident["node"], ident["host"]), []).append(ident["rank"])
        if addresses and ident.get("address"):  # reports from before 'address' have none
            where = seen.setdefault((ident["node"], ident["host"]), [])
            where += [ident["address"]] if ident["address"] not in where else []
    return [
        {"node": node, "host": host, "ranks": rs}
        | ({"addresses": seen[node, host]} if (node, host) in seen else {})
        for (node, host), rs in sorted(ranks.items(), key=lambda kv: kv[1][0])
    ]


def blocking(
    identities: list[dict], launcher: str, backend: str, names: tuple[str, ...]
) -> dict | None:
    """The report of a preflight that stops at the check-in, or None: one problem per failed
    blocking check, naming its hosts and ranks (`check_line`). `names`: the local checks
    whose failure breaks the process group itself on that node (gloo and NCCL pick their
    address from the hostname or the named interfaces, so the other ranks would only see a
    timeout: `local.registry.blocking(backend)`)."""
    failed = [c for c in merge_checks(identities) if c["status"] == "fail" and c["name"] in names]
    if not failed:
        return None
    found = Problems()
    all_hosts = sorted({i["host"] for i in identities})
    for c in failed:
        where = _hosts(c["ranks"], identities)
        kind = check_kind(c["name"], where, all_hosts)
        found.add(check_line(c, identities), "check", kind, where, f"{c['name']} check failed")
    problems = found.lines
    hosts = sorted({identities[r]["host"] for c in failed for r in c["ranks"]})
    return scheduler_keys(found.entries) | {
        "schema": REPORT_SCHEMA,
        "ok": False,
        "exit_code": EXIT_FAIL,
        "launcher": launcher,
        "backend": backend,
        "world_size": len(identities),
        "stage": "check-in",
        "problems": problems,
        "failed_hosts": hosts,
        "checks": merge_checks(identities),
        "nodes": nodes(identities),
        "line": "preflight stopped at the check-in: " + " | ".join(problems),
    }


def failed_hosts(identities, checks, comparison, collectives, matmul_result) -> list[str]:
    """Hostnames of the ranks a problem names (failed checks, the minority of a fingerprint
    comparison, wrong collectives, an odd matmul): what `sbatch --exclude` needs."""
    ranks = {r for c in checks if c["status"] == "fail" for r in c["ranks"]}
    ranks |= {i["rank"] for o in comparison["outliers"] for i in o["ranks"]}
    ranks |= {r for group in tied_groups(comparison) for r in group}  # no majority: all
    ranks |= {r for c in collectives.values() for r in c["failed_ranks"]}
    ranks |= set(matmul_result.get("odd_ranks") or [])
    return sorted({i["host"] for i in identities if i["rank"] in ranks})


def check_line(check: dict, identities: list[dict]) -> str:
    """`gloo_socket_ifname on ls3 rank 6-7: GLOO_SOCKET_IFNAME names eth0, absent here`: the
    hosts of the ranks at the check's worst status, then the first detail."""
    by_rank = {i["rank"]: i for i in identities}
    hosts = sorted({by_rank[r]["host"] for r in check["ranks"] if r in by_rank})
    shown = ",".join(hosts[:_HOSTS_SHOWN])
    if len(hosts) > _HOSTS_SHOWN:
        shown += f" and {len(hosts) - _HOSTS_SHOWN} more hosts"
    where = (
        f"on {shown} rank {ranges(check['ranks'])}"
        if shown
        else f"on rank {ranges(check['ranks'])}"
    )
    return f"{check['name']} {where}: {check['detail']}"


def with_findings(result: dict, links: dict | None, entries: list[dict]) -> dict:
    """Add the link stage's section and problems, `finding` (what ended the run, since exit 1
    covers them all: dropped, link_error, check, drift, lock, collectives, busbw, matmul,
    slow_node, slow_link; None on a pass) with `findings` (every one, in that order), and what
    the scheduler is asked (`problem_kind.scheduler_keys`: `kind`, `problem_kinds`, `drain`)."""
    found = Problems()
    found.extend(entries)
    names = []
    if links is not None:
        result["links"] = links
        found.extend(links["problem_kinds"])
        result["warnings"] = result["warnings"] + links.get("warnings", [])  # not judged
        names += [k for k in links["findings"] if k in ("dropped", "link_error")]
        # the hosts a relaunch leaves out (docs/slurm.md reads this list): the link stage's
        # exclude list too (slow nodes, a slow link's worse end, nodes that dropped out)
        hosts = result["failed_hosts"]
        result["failed_hosts"] = hosts + [h for h in links["exclude"] if h not in hosts]
    result["problems"] = found.lines
    mine = {e["finding"] for e in entries}
    names += [k for k in ("check", "drift", "lock", "collectives", "busbw", "matmul") if k in mine]
    if links is not None:
        names += [k for k in links["findings"] if k in ("slow_node", "slow_link")]
    result["finding"] = names[0] if names else None
    result["findings"] = names
    result["ok"] = not result["problems"]
    if links is not None and links["exit_code"] == EXIT_TIMEOUT:
        result["exit_code"] = EXIT_TIMEOUT
    else:
        result["exit_code"] = EXIT_FAIL if result["problems"] else EXIT_OK
    return result | scheduler_keys(found.entries)


def compared_line(comparison: dict, fingerprints: dict[int, dict]) -> str:
    """`preflight: 2 ranks identical in 57 fields; torch 2.13.0+cpu, CUDA none, NCCL none;
    lock requirements/cpu.txt matched`, from the majority's representative."""
    n = sum(len(group) for group in comparison["groups"])
    fields = comparison["compared_fields"]
    if n == 1:
        head = f"1 rank, {fields} fields fingerprinted (no peer to compare)"
    elif not comparison["outliers"]:
        head = f"{n} ranks identical in {fields} fields"
    elif tied := tied_groups(comparison):
        head = (
            f"{n} ranks compared in {fields} fields, no majority: {len(tied)} groups of "
            f"{len(tied[0])} rank{'s' if len(tied[0]) != 1 else ''} differ"
        )
    else:
        odd = n - len(comparison["majority"])
        head = f"{n} ranks compared in {fields} fields, {odd} differ from the majority"
    sections = fingerprints[comparison["majority"][0]]["sections"]
    torch = sections.get("torch") or {}
    stack = (
        f"torch {torch.get('version') or 'none'}, CUDA {torch.get('cuda') or 'none'}, "
        f"NCCL {torch.get('nccl') or 'none'}"
    )
    lock = _lock(fingerprints[comparison["majority"][0]])
    if lock is None:
        locked = "no lock given/found"
    elif lock["matches"]:
        locked = f"lock {lock['path']} matched"
    else:
        count = len(lock["extra"]) + len(lock["missing"]) + len(lock["different"])
        locked = f"lock {lock['path']} differs: {count} package{'s' if count != 1 else ''}"
    return f"preflight: {head}; {stack}; {locked}"


def outlier_line(outlier: dict, largest: list[int] | None = None) -> str:
    """`rank 3 on node1 differs from the majority in env.NCCL_ALGO, ...` (`largest`: the
    first of the largest groups, which tie: `... differs from rank 0-1 in ...`)."""
    ranks = [i["rank"] for i in outlier["ranks"]]
    verb = "differs" if len(ranks) == 1 else "differ"
    other = "the majority" if largest is None else f"rank {ranges(largest)}"
    fields = _fields_shown([f["field"] for f in outlier["fields"]])
    return f"{_where(outlier['ranks'])} {verb} from {other} in {fields}"


def tied_groups(comparison: dict) -> list[list[int]]:
    """The largest groups of ranks when more than one has that size (two ranks that differ,
    2 against 2 ...): no majority says which is odd. [] when one group is the largest."""
    groups = comparison["groups"]
    tied = [g for g in groups if len(g) == len(groups[0])]
    return tied if len(tied) > 1 else []


def tie_line(first: list[dict], outliers: list[dict]) -> str:
    """`rank 0 on node0 and rank 1 on node1 differ in env.NCCL_ALGO (no majority says which
    is odd ...)`: the first of the tied groups (`first`: its ranks' identities), the others
    (`outliers`), and the fields that differ from the first's."""
    where = [_where(first)] + [_where(o["ranks"]) for o in outliers]
    names = list(dict.fromkeys(f["field"] for o in outliers for f in o["fields"]))
    return (
        f"{' and '.join(where)} differ in {_fields_shown(names)} (no majority says which is "
        "odd: compare them with a known-good node)"
    )


def _where(ranks: list[dict]) -> str:
    hosts = sorted({i["host"] for i in ranks})
    shown_hosts = ",".join(hosts[:_HOSTS_SHOWN])
    if len(hosts) > _HOSTS_SHOWN:
        shown_hosts += f" and {len(hosts) - _HOSTS_SHOWN} more hosts"
    return f"rank {ranges([i['rank'] for i in ranks])} on {shown_hosts}"


def _fields_shown(names: list[str], shown: int = _FIELDS_SHOWN) -> str:
    fields = ", ".join(names[:shown])
    if len(names) > shown:
        fields += f" and {len(names) - shown} more"
    return fields


def merge_checks(identities: list[dict]) -> list[dict]:
    """One row per check: its worst status, the ranks at that status, the first detail."""
    order = {"fail": 0, "warn": 1, "ok": 2, "skip": 3}
    merged: dict[str, dict] = {}
    for ident in identities:
        for check in ident["checks"]:
            row = merged.get(check["name"])
            if row is None or order[check["status"]] < order[row["status"]]:
                merged[check["name"]] = {**check, "ranks": [ident["rank"]]}
            elif check["status"] == row["status"]:
                row["ranks"].append(ident["rank"])
    return list(merged.values())


def bandwidth(
    measurements: list[dict], sizes: tuple[int, ...] | list[int], min_busbw: float | None
) -> dict:
    """all_reduce busbw per size, of the slowest and the fastest rank; the floor is judged at
    the largest size, on the slowest rank (one slow link gates the job)."""
    n = len(measurements)
    if not sizes or n < 2:
        return {"sizes": [], "note": "one rank: no bandwidth to measure"}
    rows = []
    for i, size in enumerate(sizes):
        times = [m["allreduce_seconds"][i] for m in measurements]
        slowest = max(range(n), key=lambda r: times[r])
        fastest = min(range(n), key=lambda r: times[r])
        rows.append(
            {
                "bytes": size,
                "busbw_gbps_slowest": round(busbw_gbps(size, times[slowest], n), 3),
                "slowest_rank": slowest,
                "busbw_gbps_fastest": round(busbw_gbps(size, times[fastest], n), 3),
            }
        )
    out: dict[str, object] = {"sizes": rows, "min_busbw_gbps": min_busbw}
    peak = rows[-1]
    if min_busbw is not None and peak["busbw_gbps_slowest"] < min_busbw:
        out["below_min"] = (
            f"all_reduce busbw {peak['busbw_gbps_slowest']} GB/s at {peak['bytes'] >> 20} MiB "
            f"(slowest rank {peak['slowest_rank']}) is below --min-busbw {min_busbw}"
        )
    return out


def matmul(measurements: list[dict], identities: list[dict]) -> dict:
    """GPUs of one model must compute the same fixed matmul bit for bit; the ranks outside
    each model's most common checksum are named."""
    by_model: dict[str, dict[int, list[int]]] = {}
    for ident, m in zip(identities, measurements, strict=True):
        if m["matmul_checksum"] is None:  # no GPU on this rank
            continue
        model = (ident.get("gpu") or {}).get("name") or "unknown GPU"
        by_model.setdefault(model, {}).setdefault(m["matmul_checksum"], []).append(ident["rank"])
    if not by_model:
        return {"status": "skip", "detail": "no GPU: matmul checksum skipped (CPU run)"}
    odd: list[int] = []
    models: list[str] = []
    for model, sums in by_model.items():
        majority = max(sums.values(), key=len)
        wrong = [r for ranks in sums.values() if ranks is not majority for r in ranks]
        if wrong:
            odd += wrong
            models.append(model)
    if odd:
        return {
            "status": "fail",
            "detail": f"matmul checksum on rank {ranges(odd)} differs from other GPUs of the "
            f"same model ({', '.join(models)})",
            "odd_ranks": sorted(odd),
        }
    return {"status": "ok", "detail": f"identical on {len(by_model)} GPU model(s)", "odd_ranks": []}


def _lock(fingerprint: dict) -> dict | None:
    return (fingerprint["sections"].get("packages") or {}).get("lock")
