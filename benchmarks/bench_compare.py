"""Rank 0's comparison on 10,000 synthetic fingerprints with 3 outlier groups.

Each synthetic rank is this machine's real fingerprint with its own hostname and rank
variables (ignored fields); three groups differ in an env variable, the torch version and an
extra package. As in the preflight, every rank digests its own fingerprint (timed per rank) and
rank 0 groups the fixed-size digests, diffs one representative per group and builds the report
(timed: goal at most 1 s).

    .venv/bin/python benchmarks/bench_compare.py --ranks 10000
"""

from __future__ import annotations

import argparse
import copy
import time


def synthetic_ranks(n: int):
    """(digests, representatives, identities, per-rank digest seconds) of `n` synthetic ranks:
    this machine's fingerprint with each rank's hostname and rank variables, three outlier
    groups."""
    from lockstep.env.compare import Ignored, section_digests
    from lockstep.env.fingerprint import collect

    base = collect()
    ignored = Ignored()
    outlier_groups = {  # rank -> mutation; 3 groups of different sizes
        **{r: "env" for r in range(17, n, 997)},
        **{r: "torch" for r in range(400, 420)},
        **{r: "package" for r in (n - 1,)},
    }

    def fingerprint_of(rank: int) -> dict:
        fp = copy.deepcopy(base)
        sections = fp["sections"]
        sections["system"]["hostname"] = f"node{rank // 8:04d}"
        sections["env"].update(RANK=str(rank), LOCAL_RANK=str(rank % 8))
        match outlier_groups.get(rank):
            case "env":
                sections["env"]["NCCL_ALGO"] = "Ring"
            case "torch":
                sections["torch"]["version"] = "2.12.0+cpu"
            case "package":
                sections["packages"]["installed"]["stray-package"] = "0.1"
        return fp

    digests, representatives, identities, seen = [], {}, [], set()
    digest_time = 0.0
    for rank in range(n):
        fp = fingerprint_of(rank)
        start = time.perf_counter()
        row = section_digests(fp, ignored)
        digest_time += time.perf_counter() - start
        if row not in seen:  # the first rank of each group publishes its full fingerprint
            seen.add(row)
            representatives[rank] = fp
        digests.append(row)
        identities.append(
            {
                "rank": rank,
                "host": f"node{rank // 8:04d}",
                "node": rank // 8,
                "local_rank": rank % 8,
                "gpu": None,
                "checks": [{"name": "shm", "status": "ok", "detail": "/dev/shm 16 GiB"}],
            }
        )
    return digests, representatives, identities, digest_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    args = parser.parse_args()

    from lockstep.env.compare import Ignored, compare_ranks
    from lockstep.preflight.collectives import COLLECTIVES
    from lockstep.preflight.report import markdown, outlier_rows
    from lockstep.preflight.verdict import build_report

    n = args.ranks
    digests, representatives, identities, digest_time = synthetic_ranks(n)
    # what each rank measured, as preflight's rank 0 receives it (`verdict`'s docstring)
    measurements = [
        {
            "collectives": dict.fromkeys(COLLECTIVES, True),
            "allreduce_seconds": [0.002, 0.009],
            "matmul_checksum": None,
        }
        for _ in range(n)
    ]

    start = time.perf_counter()
    result = compare_ranks(digests, representatives, identities, Ignored())
    report = build_report(
        launcher="torchelastic",
        backend="gloo",
        identities=identities,
        comparison=result,
        fingerprints=representatives,
        measurements=measurements,
        sizes=(256 << 10, 4 << 20),
        min_busbw=None,
        lock_required=False,
    )
    report["elapsed_s"] = 0.0
    rows = outlier_rows(report)
    markdown(report)
    elapsed = time.perf_counter() - start

    print(f"{n} ranks, groups: {[len(g) for g in result['groups']]}")
    print(f"per-rank digest (each rank does its own): {digest_time / n * 1e3:.2f} ms")
    print(f"rank 0 grouping, outlier diffs, report, Markdown: {elapsed:.3f} s (goal <= 1 s)")
    print(f"outlier rows: {len(rows)}; fields: {sorted({r[4] for r in rows})}")


if __name__ == "__main__":
    main()
