"""The `--json` report at scale (issue 38), from the pure verdict and link functions: its size
grows linearly with the ranks and stays within a few dozen bytes a rank, and it still names the
odd rank, its node and field, the slowest links, and what the scheduler is asked."""

from __future__ import annotations

import json

from lockstep.errors import EXIT_FAIL
from lockstep.preflight import report
from lockstep.preflight.collectives import COLLECTIVES
from lockstep.preflight.links import schedule, section
from lockstep.preflight.verdict import build_report

PER_NODE = 8
RAILS = 2  # link rows on two rails of each node: enough rows to be cut, fast to judge
CHECKS = ("gpu_assignment", "nvidia_driver", "master_addr", "hostname", "shm")
BYTES_A_RANK = 80  # today (schema 2) the report took about 3,500 bytes a rank


def host(node: int) -> str:
    return f"gpu-node-{node:05d}"


def identity(r: int, odd: int) -> dict:
    node = r // PER_NODE
    checks = [{"name": c, "status": "ok", "detail": f"{c}: ok"} for c in CHECKS]
    if r == odd:
        checks[-1] = {"name": "shm", "status": "fail", "detail": "/dev/shm 64 MiB"}
    return {
        "rank": r,
        "host": host(node),
        "address": f"10.0.{node >> 8}.{node & 255}",
        "node": node,
        "local_rank": r % PER_NODE,
        "gpu": {"index": r % PER_NODE, "name": "H100", "uuid": f"GPU-{r:08x}"},
        "checks": checks,
    }


def link_section(nodes: int, slow: int) -> dict:
    """The link stage's section: the sampled schedule's rows on `RAILS` rails, node `slow` at
    a tenth of the others' rate."""
    _, rounds = schedule.schedule(nodes)
    cross = []
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            for rail in range(RAILS):
                noise = ((a * 31 + b * 17 + rail * 7) % 11 - 5) / 100  # +-5%
                gbps = 370 * (1 + noise) / (10 if slow in (a, b) else 1)
                ranks = [a * PER_NODE + rail, b * PER_NODE + rail]
                latency = 7.0 + (a + b) % 3
                cross.append(
                    dict(a=a, b=b, rail=rail, ranks=ranks, round=k, gbps=gbps, latency_us=latency)
                )
    return section.assess(
        hosts=[host(k) for k in range(nodes)],
        ranks=[list(range(k * PER_NODE, (k + 1) * PER_NODE)) for k in range(nodes)],
        local=[r % PER_NODE for r in range(nodes * PER_NODE)],
        cross=cross,
    )


def written(n: int, tmp_path, capsys) -> tuple[int, dict, dict, str]:
    """The report of `n` ranks as `--json` writes it: its bytes, what it says, the report, and
    the terminal's tables."""
    odd, slow = n // 2 + 3, n // PER_NODE // 3
    identities = [identity(r, odd) for r in range(n)]
    majority = [r for r in range(n) if r != odd]
    fields = [{"field": "env.NCCL_ALGO", "value": "Ring", "expected": None}]
    built = build_report(
        launcher="srun",
        backend="nccl",
        identities=identities,
        comparison={
            "groups": [majority, [odd]],
            "majority": majority,
            "outliers": [{"ranks": [identities[odd]], "fields": fields}],
            "duplicate_gpus": [],
            "compared_fields": 150,
            "ignored": [],
        },
        fingerprints={0: {"sections": {"torch": {"version": "2.13.0"}}}, odd: {"sections": {}}},
        measurements=[
            {
                "collectives": dict.fromkeys(COLLECTIVES, True),
                "allreduce_seconds": [0.001, 0.01],
                "matmul_checksum": 7,
            }
        ]
        * n,
        sizes=(1 << 20, 8 << 20),
        links=link_section(n // PER_NODE, slow),
    )
    built.update(elapsed_s=1.0, authenticated=True, verdict="fail")
    path = tmp_path / f"report-{n}.json"
    report.emit(built, json_path=path)
    table = capsys.readouterr().out
    return path.stat().st_size, json.loads(path.read_text()), built, table


def test_the_json_report_grows_linearly_and_still_names_the_odd_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    n = 4096  # 512 nodes: a sampled link schedule (past 32 nodes), its rows cut
    half, *_ = written(n // 2, tmp_path, capsys)
    size, doc, built, table = written(n, tmp_path, capsys)
    assert size <= BYTES_A_RANK * n, f"{size / n:.0f} bytes a rank"
    assert size <= 2.2 * half, (half, size)  # twice the ranks: at most about twice the bytes

    odd, odd_host = n // 2 + 3, host((n // 2 + 3) // PER_NODE)
    assert doc["schema"] == 3 and doc["exit_code"] == EXIT_FAIL and doc["verdict"] == "fail"
    (shm,) = [c for c in doc["checks"] if c["name"] == "shm"]
    assert (shm["status"], shm["ranks"]) == ("fail", str(odd))
    (outlier,) = doc["comparison"]["outliers"]
    assert outlier["ranks"] == str(odd) and outlier["hosts"] == [odd_host]
    assert [i["rank"] for i in outlier["identities"]] == [odd]
    assert doc["comparison"]["majority"] == f"0-{odd - 1},{odd + 1}-{n - 1}"
    assert any(f"rank {odd} on {odd_host} differs" in p for p in doc["problems"]), doc["problems"]
    assert {(e["finding"], e["kind"]) for e in doc["problem_kinds"]} >= {
        ("check", "node"),
        ("drift", "job"),  # one rank of a node differs: what the launch gave it
    }
    assert doc["kind"] == "job" and odd_host in [d["host"] for d in doc["drain"]]
    # the terminal: the named node on a row of its own, one row for all 512 (not 512 rows)
    assert f"{odd_host} " in table and "all 512" in table, table
    assert len(table.splitlines()) < 200, len(table.splitlines())
    # the report in memory keeps every link; the JSON the slowest (the slow node's) and all
    # the section names, with the statistics of every row measured
    links, kept = built["links"], doc["links"]
    assert kept["summary"]["links"]["measured"] == len(links["links"]) > len(kept["links"])
    slow = n // PER_NODE // 3
    theirs = [x for x in links["links"] if slow in (x["a"], x["b"])]  # as measured: the JSON
    shown = [{k: round(v, 4) if isinstance(v, float) else v for k, v in x.items()} for x in theirs]
    assert all(x in kept["links"] for x in shown)  # rounds each float to 4 decimals
    assert kept["summary"]["links"]["gbps"]["min"] == round(
        min(x["gbps"] for x in links["links"]), 4
    )
    for key in ("slow_nodes", "slow_links", "not_judged", "exclude", "problems"):
        assert kept[key] == links[key]
