"""The pre-launch preflight, run on every rank of the job.

Order matters: local checks need no peers; the check-in through the c10d store names ranks that
never arrive (instead of a 900 s socket timeout); the digest all-gather costs the same bytes per
rank whatever the fingerprint's size; full fingerprints travel only from one representative of
each distinct group. Rank 0 decides and posts the verdict in the store, so every rank exits
with the same code.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from datetime import timedelta
from pathlib import Path

from lockstep.env import collectives, compare, fingerprint, localchecks
from lockstep.env.launcher import RankInfo
from lockstep.errors import EXIT_FAIL, EXIT_OK, CheckFailed, RankTimeout, UsageError
from lockstep.redact import scrub_text

REPORT_SCHEMA = 1
_POLL_S = 0.05


def run_rank(info: RankInfo, args) -> int:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    timeout = timedelta(seconds=args.timeout)
    checks = localchecks.run_all(info, torch)
    unreachable = [c for c in checks if c["name"] == "master_addr" and c["status"] == "fail"]
    if unreachable:  # no way to meet the others; they will name this rank as missing
        raise CheckFailed(unreachable[0]["detail"])
    index = localchecks.device_index(info, torch)
    device = torch.device("cuda", index) if index is not None else torch.device("cpu")
    identity = _identity(info, torch, device, checks)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Before meeting peers, so a bad lock or image manifest ends every rank with exit 2 at once.
    fp = fingerprint.collect(lock=Path(args.lock) if args.lock else None)

    store = _connect(info, timeout, torch)
    try:
        os.environ["LOCKSTEP_REDACT_SALT"] = _check_in(store, info, identity, args.timeout)
        fingerprint.resalt(fp)  # one salt for the job: equal secrets hash equal on every rank
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("pg", store),
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
        )
        return _exchange_and_report(info, args, fp, store, torch, dist, device, backend, started)
    except RuntimeError as err:  # torch.distributed's errors, timeouts included
        raise RankTimeout(
            f"a peer failed or stalled during the preflight: {_first_line(err)}"
        ) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exchange_and_report(info, args, fp, store, torch, dist, device, backend, started) -> int:
    rank, n = info.rank, info.world_size
    ignored = compare.Ignored(args.allow)

    row = torch.frombuffer(bytearray(compare.section_digests(fp, ignored)), dtype=torch.uint8)
    rows = _all_gather(dist, torch, row.to(device))
    digests = [bytes(r.cpu().tolist()) for r in rows]
    groups = compare.group_ranks(digests)
    if rank in (g[0] for g in groups):
        store.set(f"fp/{rank}", fingerprint.canonical_json(fp))

    ok = collectives.verify(dist, torch, device)
    sizes = collectives.GPU_SIZES if device.type == "cuda" else collectives.CPU_SIZES
    seconds = collectives.allreduce_seconds(dist, torch, device, sizes) if n > 1 else []
    checksum = collectives.matmul_checksum(torch, device)
    mine = [int(ok[c]) for c in collectives.COLLECTIVES]
    mine += [int(s * 1e9) for s in seconds] + [checksum or 0]
    per_rank = [
        r.cpu().tolist() for r in _all_gather(dist, torch, torch.tensor(mine, device=device))
    ]

    if rank != 0:
        return _await_verdict(store, args.timeout)
    identities = [json.loads(store.get(f"checkin/{r}")) for r in range(n)]
    fingerprints = {g[0]: json.loads(store.get(f"fp/{g[0]}")) for g in groups}
    report = build_report(
        info=info,
        backend=backend,
        identities=identities,
        comparison=compare.compare_ranks(digests, fingerprints, identities, ignored),
        fingerprints=fingerprints,
        per_rank=per_rank,
        sizes=sizes if n > 1 else (),
        gpu=device.type == "cuda",
        min_busbw=args.min_busbw,
        lock_required=args.lock is not None,
    )
    report["elapsed_s"] = round(time.perf_counter() - started, 3)  # rank 0, after import torch
    store.set("verdict", str(report["exit_code"]))
    from lockstep.env import report as render

    render.emit(report, json_path=Path(args.json) if args.json else None)
    _linger(store, "verdict/read", n - 1, args.timeout)
    return report["exit_code"]


def _all_gather(dist, torch, tensor) -> list:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def _identity(info: RankInfo, torch, device, checks) -> dict:
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {
            "index": device.index,
            "name": props.name,
            "uuid": str(getattr(props, "uuid", "")).removeprefix("GPU-") or None,
        }
    return {
        "rank": info.rank,
        "host": socket.gethostname(),
        "node": info.node_rank,
        "local_rank": info.local_rank,
        "launcher": info.launcher,
        "world_size": info.world_size,
        "gpu": gpu,
        "checks": checks,
    }


def _connect(info: RankInfo, timeout: timedelta, torch):
    """The c10d TCPStore: rank 0 serves it unless torchrun's agent already does."""
    from torch.distributed import TCPStore

    serve = info.rank == 0 and not info.agent_store
    where = f"{info.master_addr}:{info.master_port}"
    if not serve and not _reachable(info.master_addr, info.master_port, timeout.total_seconds()):
        raise RankTimeout(
            f"rank 0 missing: nothing answered at MASTER_ADDR:MASTER_PORT={where} within "
            f"{timeout.total_seconds():g}s (rank 0 not started, wrong address, or a firewall)"
        )
    try:
        store = TCPStore(
            info.master_addr,
            info.master_port,
            is_master=serve,
            timeout=timeout,
            wait_for_workers=False,
            multi_tenant=serve,
        )
    except RuntimeError as err:
        if serve:
            raise UsageError(
                f"rank 0 cannot serve the store on {where}: {_first_line(err)}"
            ) from None
        raise RankTimeout(f"the store at {where} stopped answering: {_first_line(err)}") from None
    return torch.distributed.PrefixStore(f"lockstep/preflight/{_run_id()}", store)


def _reachable(host: str, port: int, within_s: float) -> bool:
    """Poll the store's port ourselves: TCPStore's own retries overrun the timeout and log
    C++ stack traces; this keeps the deadline exact and the message one line."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, within_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S * 2)


def _run_id() -> str:
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"


def _check_in(store, info: RankInfo, identity: dict, timeout_s: float) -> str:
    """Every rank posts its identity; rank 0 waits `timeout_s` for all, then answers all."""
    store.set(f"checkin/{info.rank}", json.dumps(identity))
    store.add("checkin/count", 1)
    if info.rank == 0:
        deadline = time.monotonic() + timeout_s
        while store.add("checkin/count", 0) < info.world_size and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        missing = [r for r in range(info.world_size) if not store.check([f"checkin/{r}"])]
        answer = {"missing": missing, "salt": secrets.token_hex(8)}
        store.set("checkin/done", json.dumps(answer))
        if missing:  # about to exit: let the ranks that did arrive read why
            _linger(store, "checkin/read", info.world_size - len(missing) - 1, timeout_s)
    else:
        try:
            store.wait(["checkin/done"], timedelta(seconds=timeout_s + 10))
        except RuntimeError:
            raise RankTimeout(
                f"rank 0 gave no check-in answer within {timeout_s + 10:g}s; it stalled or died"
            ) from None
        answer = json.loads(store.get("checkin/done"))
        store.add("checkin/read", 1)
    if answer["missing"]:
        raise RankTimeout(
            f"rank{'s' if len(answer['missing']) > 1 else ''} "
            f"{_ranges(answer['missing'])} of {info.world_size} never checked in within "
            f"{timeout_s:g}s (not started, crashed, or launched with another MASTER_ADDR/PORT)"
        )
    return answer["salt"]


def _await_verdict(store, timeout_s: float) -> int:
    try:
        store.wait(["verdict"], timedelta(seconds=timeout_s))
    except RuntimeError:
        raise RankTimeout(f"rank 0 sent no verdict within {timeout_s:g}s") from None
    verdict = int(store.get("verdict"))
    store.add("verdict/read", 1)
    return verdict


def _linger(store, key: str, readers: int, within_s: float) -> None:
    """Keep rank 0, and the store it may serve, up until `readers` ranks have read its answer."""
    deadline = time.monotonic() + within_s
    while store.add(key, 0) < readers and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _first_line(err: BaseException) -> str:
    return scrub_text((str(err).strip().splitlines() or [repr(err)])[0])


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': rank lists stay short at 1000 ranks."""
    parts: list[str] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def build_report(
    *,
    info: RankInfo,
    backend: str,
    identities: list[dict],
    comparison: dict,
    fingerprints: dict[int, dict],
    per_rank: list[list[int]],
    sizes: tuple[int, ...],
    gpu: bool,
    min_busbw: float | None,
    lock_required: bool,
) -> dict:
    """Rank 0's verdict: every finding, and the one-line problems that make it fail."""
    n = info.world_size
    problems: list[str] = []
    warnings: list[str] = []

    checks = _merge_checks(identities)
    for check in checks:
        line = f"{check['name']} on rank {_ranges(check['ranks'])}: {check['detail']}"
        (problems if check["status"] == "fail" else warnings).extend(
            [line] if check["status"] in ("fail", "warn") else []
        )

    for outlier in comparison["outliers"]:
        ranks = [i["rank"] for i in outlier["ranks"]]
        fields = ", ".join(f["field"] for f in outlier["fields"][:5])
        more = len(outlier["fields"]) - 5
        problems.append(
            f"rank {_ranges(ranks)} differ from the majority in {fields}"
            + (f" and {more} more" if more > 0 else "")
        )
    for dup in comparison["duplicate_gpus"]:
        problems.append(
            f"Duplicate GPU: ranks {_ranges(dup['ranks'])} share GPU {dup['uuid']} on {dup['host']}"
        )
    for group in comparison["groups"]:
        lock = fingerprints[group[0]]["sections"]["packages"]["lock"]
        if lock and not lock["matches"]:
            line = (
                f"installed packages do not match {lock['path']} on rank {_ranges(group)}: "
                f"{len(lock['extra'])} extra, {len(lock['missing'])} missing, "
                f"{len(lock['different'])} different"
            )
            (problems if lock_required else warnings).append(line)

    coll = {}
    for i, name in enumerate(collectives.COLLECTIVES):
        failed = [r for r in range(n) if not per_rank[r][i]]
        coll[name] = {"ok": not failed, "failed_ranks": failed}
        if failed:
            problems.append(f"{name} returned wrong values on rank {_ranges(failed)}")

    bandwidth = _bandwidth(per_rank, sizes, n, min_busbw)
    if bandwidth.get("below_min"):
        problems.append(bandwidth["below_min"])
    matmul = _matmul(per_rank, identities, gpu)
    if matmul["status"] == "fail":
        problems.append(matmul["detail"])

    nodes: dict[tuple, list[int]] = {}
    for ident in identities:
        nodes.setdefault((ident["node"], ident["host"]), []).append(ident["rank"])
    return {
        "schema": REPORT_SCHEMA,
        "ok": not problems,
        "exit_code": EXIT_FAIL if problems else EXIT_OK,
        "launcher": info.launcher,
        "backend": backend,
        "world_size": n,
        "nodes": [
            {"node": node, "host": host, "ranks": ranks}
            for (node, host), ranks in sorted(nodes.items(), key=lambda kv: kv[1][0])
        ],
        "problems": problems,
        "warnings": warnings,
        "checks": checks,
        "comparison": comparison,
        "collectives": coll,
        "bandwidth": bandwidth,
        "matmul": matmul,
        "fingerprints": {str(rank): fp for rank, fp in fingerprints.items()},
    }


def _merge_checks(identities: list[dict]) -> list[dict]:
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


def _bandwidth(per_rank, sizes, n, min_busbw) -> dict:
    if not sizes:
        return {"sizes": [], "note": "one rank: no bandwidth to measure"}
    offset = len(collectives.COLLECTIVES)
    rows = []
    for i, size in enumerate(sizes):
        times = [per_rank[r][offset + i] / 1e9 for r in range(n)]
        slowest = max(range(n), key=lambda r: times[r])
        fastest = min(range(n), key=lambda r: times[r])
        rows.append(
            {
                "bytes": size,
                "busbw_gbps_slowest": round(collectives.busbw_gbps(size, times[slowest], n), 3),
                "slowest_rank": slowest,
                "busbw_gbps_fastest": round(collectives.busbw_gbps(size, times[fastest], n), 3),
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


def _matmul(per_rank, identities, gpu: bool) -> dict:
    if not gpu:
        return {"status": "skip", "detail": "no GPU: matmul checksum skipped (CPU run)"}
    by_model: dict[str, dict[int, list[int]]] = {}
    for ident, row in zip(identities, per_rank, strict=True):
        by_model.setdefault(ident["gpu"]["name"], {}).setdefault(row[-1], []).append(ident["rank"])
    odd: list[int] = []
    for sums in by_model.values():
        majority = max(sums.values(), key=len)
        odd += [r for ranks in sums.values() if ranks is not majority for r in ranks]
    if odd:
        return {
            "status": "fail",
            "detail": f"matmul checksum on rank {_ranges(odd)} differs from other GPUs of the same model",
            "odd_ranks": sorted(odd),
        }
    return {"status": "ok", "detail": f"identical on {len(by_model)} GPU model(s)", "odd_ranks": []}
