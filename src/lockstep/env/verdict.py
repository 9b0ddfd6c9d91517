"""The preflight's verdict, from plain data: no processes, no process group, no torch.

Rank 0 gathers what every rank found (its identity with its local checks, its measurements)
and the comparison of fingerprints (`compare.compare_ranks`); `build_report` turns them into
the report: every finding, the one-line problems that make it fail, and the one line that says
what a passing preflight compared. How the data travels between ranks is `preflight`'s part.

A rank's measurements are a dict:
    {"collectives": {"all_reduce": True, ...}, "allreduce_seconds": [s per size, ...],
     "matmul_checksum": int or None (no GPU)}
"""

from __future__ import annotations

from lockstep.env.collectives import COLLECTIVES, busbw_gbps
from lockstep.errors import EXIT_FAIL, EXIT_OK

REPORT_SCHEMA = 1
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
) -> dict:
    """Rank 0's verdict; `identities` and `measurements` are indexed by rank."""
    n = len(identities)
    problems: list[str] = []
    warnings: list[str] = []

    checks = merge_checks(identities)
    for check in checks:
        line = f"{check['name']} on rank {ranges(check['ranks'])}: {check['detail']}"
        if check["status"] == "fail":
            problems.append(line)
        elif check["status"] == "warn":
            warnings.append(line)

    for outlier in comparison["outliers"]:
        problems.append(outlier_line(outlier))
    for dup in comparison["duplicate_gpus"]:
        problems.append(
            f"Duplicate GPU: ranks {ranges(dup['ranks'])} share GPU {dup['uuid']} on {dup['host']}"
        )
    for group in comparison["groups"]:
        lock = _lock(fingerprints[group[0]])
        if lock and not lock["matches"]:
            line = (
                f"installed packages do not match {lock['path']} on rank {ranges(group)}: "
                f"{len(lock['extra'])} extra, {len(lock['missing'])} missing, "
                f"{len(lock['different'])} different"
            )
            (problems if lock_required else warnings).append(line)

    coll = {}
    for name in COLLECTIVES:
        failed = [r for r in range(n) if not measurements[r]["collectives"][name]]
        coll[name] = {"ok": not failed, "failed_ranks": failed}
        if failed:
            problems.append(f"{name} returned wrong values on rank {ranges(failed)}")

    bw = bandwidth(measurements, sizes, min_busbw)
    if bw.get("below_min"):
        problems.append(bw["below_min"])
    mm = matmul(measurements, identities)
    if mm["status"] == "fail":
        problems.append(mm["detail"])

    nodes: dict[tuple, list[int]] = {}
    addresses: dict[tuple, list[str]] = {}
    for ident in identities:
        nodes.setdefault((ident["node"], ident["host"]), []).append(ident["rank"])
        if ident.get("address"):  # reports from before 'address' have none
            where = addresses.setdefault((ident["node"], ident["host"]), [])
            where += [ident["address"]] if ident["address"] not in where else []
    return {
        "schema": REPORT_SCHEMA,
        "ok": not problems,
        "exit_code": EXIT_FAIL if problems else EXIT_OK,
        "launcher": launcher,
        "backend": backend,
        "world_size": n,
        "compared": compared_line(comparison, fingerprints),
        "nodes": [
            {"node": node, "host": host, "ranks": ranks}
            | ({"addresses": addresses[node, host]} if (node, host) in addresses else {})
            for (node, host), ranks in sorted(nodes.items(), key=lambda kv: kv[1][0])
        ],
        "problems": problems,
        "warnings": warnings,
        "checks": checks,
        "comparison": comparison,
        "collectives": coll,
        "bandwidth": bw,
        "matmul": mm,
        "fingerprints": {str(rank): fp for rank, fp in fingerprints.items()},
    }


def compared_line(comparison: dict, fingerprints: dict[int, dict]) -> str:
    """`preflight: 2 ranks identical in 57 fields; torch 2.13.0+cpu, CUDA none, NCCL none;
    lock requirements/cpu.txt matched`, from the majority's representative."""
    n = sum(len(group) for group in comparison["groups"])
    fields = comparison["compared_fields"]
    if n == 1:
        head = f"1 rank, {fields} fields fingerprinted (no peer to compare)"
    elif not comparison["outliers"]:
        head = f"{n} ranks identical in {fields} fields"
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


def outlier_line(outlier: dict) -> str:
    """`rank 3 on node1 differs from the majority in env.NCCL_ALGO, ...`."""
    ranks = [i["rank"] for i in outlier["ranks"]]
    hosts = sorted({i["host"] for i in outlier["ranks"]})
    shown_hosts = ",".join(hosts[:_HOSTS_SHOWN])
    if len(hosts) > _HOSTS_SHOWN:
        shown_hosts += f" and {len(hosts) - _HOSTS_SHOWN} more hosts"
    names = [f["field"] for f in outlier["fields"]]
    fields = ", ".join(names[:_FIELDS_SHOWN])
    if len(names) > _FIELDS_SHOWN:
        fields += f" and {len(names) - _FIELDS_SHOWN} more"
    verb = "differs" if len(ranks) == 1 else "differ"
    return f"rank {ranges(ranks)} on {shown_hosts} {verb} from the majority in {fields}"


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


def ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': rank lists stay short at 1000 ranks."""
    parts: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _lock(fingerprint: dict) -> dict | None:
    return (fingerprint["sections"].get("packages") or {}).get("lock")
