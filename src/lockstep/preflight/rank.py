"""The pre-launch preflight's protocol, run on every rank of the job.

Order matters: local checks need no peers; the check-in through the c10d store names ranks that
never arrive (instead of a 900 s socket timeout); the digest all-gather costs the same bytes per
rank whatever the fingerprint's size; full fingerprints travel only from one representative of
each distinct group. Rank 0 decides (`verdict.build_report`, pure) and posts the verdict in the
store, so every rank exits with the same code.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lockstep.env import compare, fingerprint
from lockstep.errors import EXIT_TIMEOUT, CheckFailed, RankTimeout
from lockstep.launch.detect import RankInfo
from lockstep.preflight import (
    collectives,
    heartbeat,
    job_key,
    report,
    report_json,
    silence,
    verdict,
)
from lockstep.preflight.identity import identity_of
from lockstep.preflight.lines import first_line, ranges
from lockstep.preflight.links import stage as link_stage
from lockstep.preflight.links.layout import layout
from lockstep.preflight.local import gpu, registry
from lockstep.preflight.options import Options
from lockstep.preflight.store import CheckIn, Refused, Signer, Store, connect

CHECKIN_ANSWER, VERDICT = "checkin/answer", "verdict/answer"  # what rank 0's heartbeat says
VERDICT_LIMIT = 30  # x --timeout: how long the others wait for a rank 0 whose heartbeat goes on


@dataclass(frozen=True)
class _Job:
    """This rank's place in the preflight, once it has met its peers."""

    info: RankInfo
    store: Store  # the preflight's own prefix of the c10d store
    checkin: CheckIn
    device: torch.device
    options: Options
    beat: heartbeat.Heartbeat | None  # rank 0's
    watch: heartbeat.Watch  # the others' wait for rank 0's answers

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def timeout_s(self) -> float:
        return self.options.timeout


@dataclass(frozen=True)
class _Gathered:
    """What every rank learns in the exchange; rank 0 reads the rest from the store."""

    digests: list[bytes]  # per rank: the section digests of its fingerprint
    groups: list[list[int]]  # ranks with equal digests, largest first
    rows: list[list[int]]  # per rank: `_pack`ed collectives, all_reduce times, matmul checksum
    sizes: tuple[int, ...]  # the all_reduce sizes timed (none for one rank)


def run_rank(info: RankInfo, options: Options) -> int:
    started = time.perf_counter()
    signer = Signer(job_key.load())
    job_key.require(signer.key, options.require_key)
    checks = registry.run_all(info, torch)
    fatal = registry.fatal()
    unreachable = [c for c in checks if c["name"] in fatal and c["status"] == "fail"]
    if unreachable:  # no way to meet the others; they will name this rank as missing
        raise CheckFailed(unreachable[0]["detail"])
    index = gpu.device_index(info, torch)
    device = torch.device("cuda", index) if index is not None else torch.device("cpu")
    identity = identity_of(info, device, checks)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Before meeting peers, so a bad lock or image manifest ends every rank with exit 2 at once.
    fp = fingerprint.collect(lock=Path(options.lock) if options.lock else None)

    store = _connect(info, options.timeout, signer)
    beat_s, stall_s = heartbeat.intervals(options.timeout)
    beat = heartbeat.Heartbeat(store, beat_s).start() if info.rank == 0 else None
    watch = heartbeat.Watch(store, stall_s, f"rank 0 (at MASTER_ADDR={info.master_addr})")
    job = _Job(info, store, CheckIn(store, "checkin"), device, options, beat, watch)
    try:
        os.environ["LOCKSTEP_REDACT_SALT"] = _check_in(job, identity)
        fingerprint.resalt(fp)  # one salt for the job: equal secrets hash equal on every rank
        dist.init_process_group(
            job.backend,
            store=dist.PrefixStore("pg", store.raw),
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=options.timeout),
            device_id=device if device.type == "cuda" else None,  # eager: P2P batches reuse it
        )
        ignored = compare.Ignored(options.allow)
        gathered = _exchange(job, fp, ignored)
        links = _links(job)
        if info.rank != 0:
            return _await_verdict(job)
        return _decide(job, gathered, ignored, started, links)
    except Refused:
        if info.rank == 0:  # a forgery read on rank 0: every rank fails with it, named here
            _post_verdict(job, 1)
        raise
    except RuntimeError as err:  # torch.distributed's errors, timeouts included
        from lockstep.forensics import recorder

        # --nproc: every rank dumps (on a loaded 2-core machine the others needed over 3 s)
        recorder.timed_out(f"preflight: {first_line(err)}", wait=10.0)
        silent = _silent_ranks(job)  # RankTimeout naming rank 0 where its heartbeat stopped
        if silent:
            raise RankTimeout(
                f"{silent} stopped answering during the preflight (link down, node lost or "
                f"process killed): {first_line(err)}"
            ) from None
        raise RankTimeout(
            f"a peer failed or stalled during the preflight: {first_line(err)}"
        ) from None
    finally:
        if beat is not None:
            beat.stop()
        if dist.is_initialized():
            dist.destroy_process_group()


def _exchange(job: _Job, fp: dict, ignored: compare.Ignored) -> _Gathered:
    """The collective part, the same on every rank: digests, representatives' fingerprints
    into the store, collectives by value, all_reduce timings, the matmul checksum."""
    n, device = job.info.world_size, job.device
    signer, me = job.store.signer, job.info.rank
    sealed = collectives.seal_bytes(signer, "digests", me, compare.section_digests(fp, ignored))
    row = torch.frombuffer(bytearray(sealed), dtype=torch.uint8)
    digests = [
        collectives.open_bytes(signer, "digests", r, bytes(got.cpu().tolist()))
        for r, got in enumerate(_all_gather(row.to(device)))
    ]
    groups = compare.group_ranks(digests)
    if job.info.rank in (g[0] for g in groups):
        job.store.put_text(f"fp/{job.info.rank}", fingerprint.canonical_json(fp))

    ok = collectives.verify(dist, torch, device)
    sizes: tuple[int, ...] = ()  # one rank: no bandwidth to measure
    if n > 1:
        sizes = collectives.GPU_SIZES if device.type == "cuda" else collectives.CPU_SIZES
    seconds = collectives.allreduce_seconds(dist, torch, device, sizes)
    checksum = collectives.matmul_checksum(torch, device)
    mine = collectives.seal_ints(signer, "rows", me, _pack(ok, seconds, checksum))
    rows = [
        collectives.open_ints(signer, "rows", r, got.cpu().tolist())
        for r, got in enumerate(_all_gather(torch.tensor(mine, device=device)))
    ]
    return _Gathered(digests=digests, groups=groups, rows=rows, sizes=sizes)


def _links(job: _Job):
    """The link stage (issue 23): every rank measures its pairs (`links.stage.run_stage`);
    rank 0 gets (its `Outcome`, stage start) to judge later, or None. On by default when the ranks
    span more than one host: the layout's all-gather (hostnames, one fixed-size tensor), which
    the stage needs anyway, gives every rank the same answer (the check-in's identities are
    rank 0's alone); a single-host job stops there, one all-gather of 65 integers later.
    `--links` runs it on one host too (between its ranks), `--no-links` never. A rank starved
    of CPU would read as a slow link (a clean 4-node x 2-rank srun launch on a 2-core machine
    at load ~14 named one at half speed): the stage measures each transfer's run-queue wait
    and leaves starved links unjudged (`links.bandwidth`, `links.stats.STARVED_FRACTION`,
    docs/benchmarks.md)."""
    wanted = job.options.links
    if wanted is False or job.info.world_size < 2:
        return None
    lay = layout(dist, torch, job.device, job.info.local_rank)
    if wanted is None and len(lay.hosts) < 2:
        return None
    started = time.monotonic()
    outcome = link_stage.run_stage(
        dist,
        torch,
        job.device,
        job.store,
        rank=job.info.rank,
        lay=lay,
        timeout_s=job.timeout_s,
        min_link_gbps=job.options.min_link_gbps,
    )
    return outcome, started


def _decide(
    job: _Job, gathered: _Gathered, ignored: compare.Ignored, started: float, links=None
) -> int:
    """Rank 0: read identities and fingerprints from the store, judge, post and print."""
    n, store, options = job.info.world_size, job.store, job.options
    heartbeat.planted(job.beat)  # tests only: LOCKSTEP_PREFLIGHT_FAULT
    identities = [job.checkin.read(r) for r in range(n)]  # gathered at the check-in: no read
    link_section = None
    if links is not None:
        link_section = link_stage.collect(
            store,
            links[0],
            world=n,
            identities=identities,
            timeout_s=job.timeout_s,
            started=links[1],
            min_link_gbps=options.min_link_gbps,
            judge_intra=job.device.type == "cuda",
            nbytes=link_stage.stage_bytes(job.device),
        )
    fingerprints = read_fingerprints(store, gathered.groups)
    result = verdict.build_report(
        launcher=job.info.launcher,
        backend=job.backend,
        identities=identities,
        comparison=compare.compare_ranks(gathered.digests, fingerprints, identities, ignored),
        fingerprints=fingerprints,
        measurements=[
            _unpack(row, len(gathered.sizes), gpu=ident["gpu"] is not None)
            for row, ident in zip(gathered.rows, identities, strict=True)
        ],
        sizes=gathered.sizes,
        min_busbw=options.min_busbw,
        lock_required=options.lock is not None,
        links=link_section,
    )
    result["elapsed_s"] = round(time.perf_counter() - started, 3)  # rank 0, after import torch
    result["authenticated"] = store.signer.authenticated
    # docs/json.md's exit-code table: what the verdict line says, for scripts reading the JSON
    result["verdict"] = (
        ("pass" if result["authenticated"] else "unauthenticated")
        if result["ok"]
        else "timeout"
        if result["exit_code"] == EXIT_TIMEOUT
        else "fail"
    )
    verdict_board = CheckIn(store, "verdict")
    verdict_board.answer(result["exit_code"])
    _posted(job, VERDICT)
    report.emit(result, json_path=Path(options.json) if options.json else None)
    if link_section is not None:
        link_stage.write_outputs(link_section, exclude_out=options.exclude_out, plot=options.plot)
    silent = len(link_section["silent_ranks"]) if link_section else 0
    verdict_board.linger(n - 1 - silent, job.timeout_s)
    return result["exit_code"]


def _post_verdict(job: _Job, code: int) -> None:
    """Rank 0 ends early (a forgery refused): the others get `code` and read it."""
    board = CheckIn(job.store, "verdict")
    board.answer(code)
    _posted(job, VERDICT)
    board.linger(job.info.world_size - 1, min(job.timeout_s, 10.0))


def _pack(ok: dict[str, bool], seconds: list[float], checksum: int | None) -> list[int]:
    """One rank's measurements as int64s for the all-gather (times in ns)."""
    flags = [int(ok[name]) for name in collectives.COLLECTIVES]
    return flags + [int(s * 1e9) for s in seconds] + [checksum or 0]


def _unpack(row: list[int], sizes: int, gpu: bool) -> dict:
    """`_pack`'s inverse, as `verdict` takes it; `gpu`: the rank had a checksum to send."""
    k = len(collectives.COLLECTIVES)
    return {
        "collectives": {name: bool(row[i]) for i, name in enumerate(collectives.COLLECTIVES)},
        "allreduce_seconds": [ns / 1e9 for ns in row[k : k + sizes]],
        "matmul_checksum": row[-1] if gpu else None,
    }


def _all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def _connect(info: RankInfo, timeout_s: float, signer: Signer) -> Store:
    """The c10d TCPStore: rank 0 serves it unless torchrun's agent already does; this job's
    prefix of it, signed under the run's nonce (rank 0 makes it)."""
    serve = info.rank == 0 and not info.agent_store
    where = f"{info.master_addr}:{info.master_port}"
    store = connect(
        info.master_addr,
        info.master_port,
        serve=serve,
        timeout_s=timeout_s,
        reach_s=timeout_s,
        multi_tenant=serve,
        messages={
            "unreachable": f"rank 0 missing: nothing answered at MASTER_ADDR:MASTER_PORT={where} "
            f"within {timeout_s:g}s (rank 0 not started, wrong address, or a firewall)",
            "cannot_serve": f"rank 0 cannot serve the store on {where}",
            "name": "the store",
        },
    )
    store = store.prefixed(f"lockstep/preflight/{_run_id()}")
    store = store.signed(signer, f"rank {info.rank} on {socket.gethostname()}")
    run = store.begin_run(make=info.rank == 0, within_s=timeout_s)
    if run is None:
        raise RankTimeout(f"rank 0 posted no run nonce within {timeout_s:g}s; it stalled or died")
    return run


def _run_id() -> str:
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"


def _check_in(job: _Job, identity: dict) -> str:
    """Every rank posts its identity; rank 0 waits `--timeout` for all, then answers all.
    A local check that would break the process group on some node (its hostname does not
    resolve, GLOO/NCCL_SOCKET_IFNAME names an absent interface) ends every rank here with the
    nodes and ranks named (`verdict.blocking`), before any collective could hang on it. The
    answer carries the job's redaction salt."""
    info, timeout_s, checkin = job.info, job.timeout_s, job.checkin
    checkin.post(info.rank, identity, who=socket.gethostname())
    if info.rank == 0:
        answer = answer_checkin(
            checkin, info.world_size, timeout_s, info.launcher, job.backend, job.options.json
        )
        missing = answer["missing"]
        _posted(job, CHECKIN_ANSWER)
        if missing or answer["blocked"]:  # about to exit: let the ranks that did arrive read why
            checkin.linger(info.world_size - len(missing) - 1, timeout_s)
    else:
        posted = job.watch.wait_for(CHECKIN_ANSWER, timeout_s + 10, "the check-in's answer")
        answer = checkin.await_answer(timeout_s, _is_checkin_answer) if posted else None
        if answer is None:
            raise RankTimeout(
                f"rank 0 gave no check-in answer within {timeout_s + 10:g}s; it stalled or died"
            )
    if answer.get("blocked"):
        raise CheckFailed(answer["blocked"])
    if answer["missing"]:
        raise RankTimeout(
            f"rank{'s' if len(answer['missing']) > 1 else ''} "
            f"{ranges(answer['missing'])} of {info.world_size} never checked in within "
            f"{timeout_s:g}s (not started, crashed, or launched with another MASTER_ADDR/PORT)"
        )
    return answer["salt"]


def answer_checkin(
    checkin: CheckIn, world: int, timeout_s: float, launcher: str, backend: str, json_path
) -> dict:
    """Rank 0's half of the check-in: gather every identity (`checkin` keeps them: the
    verdict reads them from there, not from the store again), decide, post the answer."""
    posted = checkin.gather(world, time.monotonic() + timeout_s, _is_identity)
    missing = [r for r in range(world) if r not in posted]
    answer = {"missing": missing, "salt": secrets.token_hex(8), "blocked": None}
    if checkin.refused:  # forged or malformed check-ins: named, never believed
        answer["blocked"] = "preflight: " + " | ".join(r.detail for r in checkin.refused.values())
    elif not missing:
        identities = [posted[r] for r in range(world)]
        blocked = verdict.blocking(identities, launcher, backend, registry.blocking(backend))
        if blocked:
            answer["blocked"] = blocked["line"]
            if json_path:
                report_json.write(blocked, Path(json_path))
    checkin.answer(answer)
    return answer


def read_fingerprints(store: Store, groups: list[list[int]]) -> dict[int, dict]:
    """Rank 0: each group's representative's full fingerprint, in one round trip."""
    firsts = [g[0] for g in groups]
    return dict(zip(firsts, store.get_many([f"fp/{r}" for r in firsts]), strict=True))


def _silent_ranks(job: _Job) -> str | None:
    """After a collective failed: the ranks cut off, `ranks 4-5 on ls2 (10.0.0.3)`, diagnosed
    once by rank 0 (`silence`); None where every rank answered or the store is gone too."""
    store, info = job.store, job.info
    try:
        silence.report_in(store, info.rank)
        if info.rank == 0:
            return silence.diagnose(
                store, info.world_size, job.checkin.read, job.timeout_s, job.beat
            )
        # rank 0 gives up on its own collective up to --timeout later, then waits --timeout
        return silence.await_diagnosis(store, job.watch, 2 * job.timeout_s + 10)
    except (RuntimeError, ValueError, Refused):
        return None


def _posted(job: _Job, key: str) -> None:
    if job.beat is not None:
        job.beat.posted(key)


def _await_verdict(job: _Job) -> int:
    """Rank 0's verdict, waited for as long as its heartbeat goes on, at most
    `VERDICT_LIMIT` x `--timeout`: a large job's rank 0 is slow, not stalled."""
    limit = VERDICT_LIMIT * job.timeout_s
    if not job.watch.wait_for(VERDICT, limit, "the verdict"):
        raise RankTimeout(
            f"{job.watch.who} sent no verdict within {limit:g}s (its heartbeat went on)"
        )
    code = CheckIn(job.store, "verdict").await_answer(job.timeout_s, lambda v: v in (0, 1, 2, 3, 4))
    if code is None:
        raise RankTimeout(f"rank 0 sent no verdict within {job.timeout_s:g}s")
    return int(code)


def _is_identity(value: object) -> bool:
    """A rank's check-in as `verdict` reads it (anything else is refused as malformed)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("rank"), int)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("checks"), list)
        and all(isinstance(c, dict) for c in value["checks"])
    )


def _is_checkin_answer(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("missing"), list)
        and isinstance(value.get("salt"), str)
        and isinstance(value.get("blocked"), str | None)
    )
