"""The preflight's verdict from plain data: no processes, no process group, no torch."""

from __future__ import annotations

from lockstep.errors import EXIT_FAIL, EXIT_OK
from lockstep.preflight.collectives import COLLECTIVES
from lockstep.preflight.lines import ranges
from lockstep.preflight.local.registry import blocking as blocking_checks
from lockstep.preflight.verdict import blocking, build_report, merge_checks

SIZES = (256 << 10, 4 << 20)
LOCK = {
    "path": "requirements/cpu.txt",
    "matches": True,
    "extra": {},
    "missing": {},
    "different": {},
}


def identity(rank: int, host: str = "node0", gpu: str | None = None, checks=None) -> dict:
    return {
        "rank": rank,
        "host": host,
        "node": 0 if host == "node0" else 1,
        "local_rank": rank,
        "gpu": {"index": rank, "name": gpu, "uuid": f"{host}-{rank}"} if gpu else None,
        "checks": checks or [{"name": "shm", "status": "ok", "detail": "/dev/shm 16.0 GiB"}],
    }


def fingerprint(lock: dict | None = None, cuda: str | None = None) -> dict:
    return {
        "sections": {
            "torch": {"version": "2.13.0+cpu", "cuda": cuda, "nccl": None},
            "packages": {"lock": lock},
        }
    }


def measured(seconds=(0.001, 0.01), checksum: int | None = None, broken=()) -> dict:
    return {
        "collectives": {name: name not in broken for name in COLLECTIVES},
        "allreduce_seconds": list(seconds),
        "matmul_checksum": checksum,
    }


def comparison(groups: list[list[int]], identities: list[dict], fields=()) -> dict:
    outliers = [
        {
            "ranks": [identities[r] for r in group],
            "fields": [{"field": f, "value": "x", "expected": "y"} for f in fields],
        }
        for group in groups[1:]
    ]
    return {
        "groups": groups,
        "majority": groups[0],
        "outliers": outliers,
        "duplicate_gpus": [],
        "compared_fields": 57,
        "ignored": [],
    }


def verdict(identities, measurements, groups=None, fields=(), fingerprints=None, **kw) -> dict:
    groups = groups or [list(range(len(identities)))]
    return build_report(
        launcher="torchelastic",
        backend="gloo",
        identities=identities,
        comparison=comparison(groups, identities, fields),
        fingerprints=fingerprints or {g[0]: fingerprint(LOCK) for g in groups},
        measurements=measurements,
        sizes=SIZES,
        **kw,
    )


def test_identical_ranks_pass_and_say_what_was_compared():
    report = verdict([identity(0), identity(1)], [measured(), measured()])
    assert report["ok"] and report["exit_code"] == EXIT_OK and report["problems"] == []
    assert report["compared"] == (
        "preflight: 2 ranks identical in 57 fields; torch 2.13.0+cpu, CUDA none, NCCL none; "
        "lock requirements/cpu.txt matched"
    )
    assert report["matmul"]["status"] == "skip"
    assert [row["bytes"] for row in report["bandwidth"]["sizes"]] == list(SIZES)
    assert report["nodes"] == [{"node": 0, "host": "node0", "ranks": [0, 1]}]


def test_compared_line_without_a_lock_and_with_a_differing_one():
    ids = [identity(0), identity(1)]
    none = verdict(ids, [measured(), measured()], fingerprints={0: fingerprint(None)})
    assert none["compared"].endswith("; no lock given/found")
    off = {**LOCK, "matches": False, "extra": {"a": "1"}, "different": {"b": {}, "c": {}}}
    differs = verdict(ids, [measured(), measured()], fingerprints={0: fingerprint(off)})
    assert differs["compared"].endswith("; lock requirements/cpu.txt differs: 3 packages")
    assert differs["ok"] and any("do not match" in w for w in differs["warnings"])
    required = verdict(
        ids, [measured(), measured()], fingerprints={0: fingerprint(off)}, lock_required=True
    )
    assert not required["ok"] and any("do not match" in p for p in required["problems"])


def test_a_lock_difference_names_the_first_ten_packages_of_each_kind():
    ids = [identity(0), identity(1)]
    extra = {f"pkg{i:02d}": "1.0" for i in range(19)}
    off = {**LOCK, "matches": False, "extra": extra, "missing": {"numpy": "2.4.6"},
           "different": {"torch": {"installed": "2.13.0", "locked": "2.12.0"}}}  # fmt: skip
    report = verdict(ids, [measured(), measured()], fingerprints={0: fingerprint(off)})
    (line,) = [w for w in report["warnings"] if "do not match" in w]
    assert line == (
        "installed packages do not match requirements/cpu.txt on rank 0-1: 19 extra ("
        + ", ".join(f"pkg{i:02d} 1.0" for i in range(10))
        + " and 9 more), 1 missing (numpy==2.4.6), 1 different (torch 2.13.0 installed, "
        "2.12.0 locked)"
    )


def test_a_tie_names_both_sides_and_no_majority():
    ids = [identity(0), identity(1, host="node1")]
    report = verdict(ids, [measured()] * 2, groups=[[0], [1]], fields=["env.NCCL_ALGO"])
    assert report["problems"] == [
        "rank 0 on node0 and rank 1 on node1 differ in env.NCCL_ALGO (no majority says which "
        "is odd: compare them with a known-good node)"
    ]
    assert report["failed_hosts"] == ["node0", "node1"]
    assert (
        "2 ranks compared in 57 fields, no majority: 2 groups of 1 rank differ"
        in (report["compared"])
    )
    four = [identity(r, host=f"node{r // 2}") for r in range(4)] + [identity(4, host="node2")]
    split = verdict(four, [measured()] * 5, groups=[[0, 1], [2, 3], [4]], fields=["x"])
    assert split["problems"][0].startswith("rank 0-1 on node0 and rank 2-3 on node1 differ in x")
    assert split["problems"][1] == "rank 4 on node2 differs from rank 0-1 in x"


def test_outlier_rank_is_named_with_its_host_and_field():
    ids = [identity(0), identity(1), identity(2, host="node1")]
    report = verdict(
        ids, [measured()] * 3, groups=[[0, 1], [2]], fields=["env.NCCL_ALGO", "system.kernel"]
    )
    assert not report["ok"] and report["exit_code"] == EXIT_FAIL
    assert report["problems"] == [
        "rank 2 on node1 differs from the majority in env.NCCL_ALGO, system.kernel"
    ]
    assert "2 ranks identical" not in report["compared"]
    assert "3 ranks compared in 57 fields, 1 differ" in report["compared"]


def test_busbw_below_the_minimum_names_the_slowest_rank():
    slow = measured(seconds=(0.002, 0.5))
    report = verdict([identity(0), identity(1)], [measured(), slow], min_busbw=1.0)
    peak = report["bandwidth"]["sizes"][-1]
    assert peak["slowest_rank"] == 1 and peak["busbw_gbps_slowest"] < 1.0
    assert report["problems"] == [report["bandwidth"]["below_min"]]
    assert "(slowest rank 1) is below --min-busbw 1.0" in report["problems"][0]
    assert verdict([identity(0), identity(1)], [measured(), slow], min_busbw=0.001)["ok"]


def test_matmul_checksum_differing_within_one_gpu_model_fails():
    ids = [identity(r, gpu="H100") for r in range(3)] + [identity(3, gpu="A100")]
    sums = [measured(checksum=c) for c in (7, 7, 8, 9)]  # the A100's own sum is fine
    report = verdict(ids, sums)
    assert report["matmul"]["status"] == "fail" and report["matmul"]["odd_ranks"] == [2]
    assert "matmul checksum on rank 2 differs" in report["problems"][0]
    assert "(H100)" in report["problems"][0]
    same = verdict(ids, [measured(checksum=c) for c in (7, 7, 7, 9)])
    assert same["ok"] and same["matmul"]["detail"] == "identical on 2 GPU model(s)"


def test_failed_collective_and_worst_local_check_per_rank():
    warn = [{"name": "shm", "status": "warn", "detail": "/dev/shm is 64 MiB (< 1 GiB)"}]
    ids = [identity(0), identity(1, checks=warn), identity(2, checks=warn)]
    report = verdict(ids, [measured(), measured(), measured(broken=("broadcast",))])
    assert report["collectives"]["broadcast"] == {"ok": False, "failed_ranks": [2]}
    assert report["problems"] == ["broadcast returned wrong values on rank 2"]
    assert report["warnings"] == ["shm on node0 rank 1-2: /dev/shm is 64 MiB (< 1 GiB)"]
    (row,) = merge_checks(ids)
    assert row["status"] == "warn" and row["ranks"] == [1, 2]


def test_one_rank_has_no_bandwidth_and_nothing_to_compare():
    report = build_report(
        launcher="manual",
        backend="gloo",
        identities=[identity(0)],
        comparison=comparison([[0]], [identity(0)]),
        fingerprints={0: fingerprint(None)},
        measurements=[measured(seconds=())],
        sizes=(),
    )
    assert report["ok"] and report["bandwidth"]["sizes"] == []
    assert report["compared"].startswith("preflight: 1 rank, 57 fields fingerprinted")


def test_rank_ranges_stay_short():
    assert ranges([5, 0, 2, 1]) == "0-2,5" and ranges([3]) == "3"


def test_a_blocking_local_check_names_hosts_and_ranks_and_stops_at_check_in():
    """A node's hostname that does not resolve, or a GLOO_SOCKET_IFNAME absent there, breaks
    the process group on that node: the check-in stops every rank, naming the node."""
    bad_host = {
        "name": "hostname",
        "status": "fail",
        "detail": "own hostname 'ls2' does not resolve",
    }
    bad_if = {
        "name": "gloo_socket_ifname",
        "status": "fail",
        "detail": "GLOO_SOCKET_IFNAME names eth0, absent here",
    }
    ok = [{"name": "hostname", "status": "ok", "detail": "resolves"}]
    idents = [identity(r, f"ls{r // 2}", checks=ok) for r in range(8)]
    for r in (4, 5):
        idents[r]["checks"] = [bad_host]
    for r in (6, 7):
        idents[r]["checks"] = [*ok, bad_if]
    got = blocking(idents, "slurm", "gloo", blocking_checks("gloo"))
    assert got["exit_code"] == 1 and got["failed_hosts"] == ["ls2", "ls3"]
    assert "hostname on ls2 rank 4-5: own hostname 'ls2' does not resolve" in got["line"]
    assert "gloo_socket_ifname on ls3 rank 6-7: GLOO_SOCKET_IFNAME names eth0" in got["line"]
    assert blocking(idents, "slurm", "nccl", blocking_checks("nccl"))["failed_hosts"] == ["ls2"]
    passing = [identity(r, checks=ok) for r in range(2)]
    assert blocking(passing, "slurm", "gloo", blocking_checks("gloo")) is None


def test_the_link_stages_exclude_list_joins_failed_hosts():
    """docs/slurm.md requeues without `failed_hosts`: a slow node the link stage named is in it,
    after the hosts of the other findings."""
    from lockstep.preflight.links.schedule import round_robin
    from lockstep.preflight.links.section import assess

    hosts = ["ls0", "ls1", "ls2", "ls3"]
    cross = [
        {"a": a, "b": b, "rail": 0, "ranks": [a, b], "round": k,
         "gbps": 0.2 if 2 in (a, b) else 0.96}
        for k, pairs in enumerate(round_robin(4))
        for a, b in pairs
    ]  # fmt: skip
    # the confirmation round: ls2's links measured again, slow again (named only then, #38)
    cross += [{**x, "round": 3} for x in cross if 2 in (x["a"], x["b"])]
    links = assess(hosts=hosts, ranks=[[k] for k in range(4)], local=[0] * 4,
                   cross=cross, timeout_s=5)  # fmt: skip
    ids = [identity(r, host=h) for r, h in enumerate(hosts)]
    report = verdict(ids, [measured() for _ in hosts], links=links)
    assert links["exclude"] == ["ls2"] and report["finding"] == "slow_node"
    assert report["exit_code"] == EXIT_FAIL and report["failed_hosts"] == ["ls2"]
    drift = verdict(ids, [measured() for _ in hosts], groups=[[0, 1, 2], [3]],
                    fields=["env.NCCL_DEBUG"], links=links)  # fmt: skip
    assert drift["failed_hosts"] == ["ls3", "ls2"]


# --- node or job: what the verdict asks of the scheduler (problem_kind) ---


def test_a_whole_node_that_drifts_is_drained_and_ranks_of_one_node_that_differ_are_the_jobs():
    """Drift on every rank of one host (a package installed differently there) is the node's,
    with a `lockstep: ` reason for Slurm; drift on one rank of a host whose other ranks agree
    with the majority is what the launch gave it: the job's, nothing drained."""
    ids = [identity(r, host=f"ls{r // 2}") for r in range(6)]
    node = verdict(ids, [measured()] * 6, groups=[[0, 1, 2, 3], [4, 5]],
                   fields=["packages.installed.numpy"])  # fmt: skip
    (entry,) = node["problem_kinds"]
    assert (entry["finding"], entry["kind"], entry["hosts"]) == ("drift", "node", ["ls2"])
    assert node["kind"] == "node" and node["exit_code"] == EXIT_FAIL
    assert node["drain"] == [
        {
            "host": "ls2",
            "reason": "lockstep: differs from the other nodes in packages.installed.numpy",
        }
    ]
    assert node["drain_hostlist"] == "ls2"
    job = verdict(ids, [measured()] * 6, groups=[[0, 1, 2, 3, 4], [5]],
                  fields=["env.NCCL_ALGO"])  # fmt: skip
    assert [e["kind"] for e in job["problem_kinds"]] == ["job"]
    assert job["kind"] == "job" and job["drain"] == [] and job["drain_hostlist"] == ""
    assert job["exit_code"] == EXIT_FAIL  # both kinds: the job must not start


def test_a_lock_missed_everywhere_is_the_jobs_and_a_tie_drains_nothing():
    ids = [identity(r, host=f"ls{r}") for r in range(3)]
    off = {**LOCK, "matches": False, "missing": {"numpy": "2.4.6"}}
    lock = verdict(ids, [measured()] * 3, fingerprints={0: fingerprint(off)}, lock_required=True)
    assert [(e["finding"], e["kind"]) for e in lock["problem_kinds"]] == [("lock", "job")]
    assert lock["kind"] == "job" and lock["drain"] == []
    # the lock missed by one node alone (drifted there): that node's
    fps = {0: fingerprint(LOCK), 2: fingerprint(off)}
    one = verdict(ids, [measured()] * 3, groups=[[0, 1], [2]], fields=["packages.installed.numpy"],
                  fingerprints=fps, lock_required=True)  # fmt: skip
    assert [(e["finding"], e["kind"]) for e in one["problem_kinds"]] == [
        ("drift", "node"),
        ("lock", "node"),
    ]
    assert [d["host"] for d in one["drain"]] == ["ls2"]
    assert one["drain"][0]["reason"] == (
        "lockstep: differs from the other nodes in packages.installed.numpy; installed packages "
        "differ from the job's lock"
    )
    two = [identity(0, host="ls0"), identity(1, host="ls1")]
    tie = verdict(two, [measured()] * 2, groups=[[0], [1]], fields=["env.NCCL_ALGO"])
    assert tie["kind"] == "job" and tie["drain"] == []  # no majority says which node is odd


def test_a_check_failing_on_some_hosts_is_theirs_and_on_every_host_the_jobs():
    small = {"name": "shm", "status": "fail", "detail": "/dev/shm 64 MiB"}
    ok = {"name": "shm", "status": "ok", "detail": "/dev/shm 16.0 GiB"}
    some = [identity(r, host=f"ls{r}", checks=[small if r == 1 else ok]) for r in range(3)]
    got = verdict(some, [measured()] * 3)
    assert got["kind"] == "node" and got["drain"] == [
        {"host": "ls1", "reason": "lockstep: shm check failed"}
    ]
    every = [identity(r, host=f"ls{r}", checks=[small]) for r in range(3)]
    assert verdict(every, [measured()] * 3)["kind"] == "job"  # the pod's or image's /dev/shm
    # wrong values from a collective and an odd GPU checksum: the hardware of those hosts
    hw = verdict(
        [identity(r, host=f"ls{r}", gpu="H100") for r in range(3)],
        [measured(checksum=7, broken=("all_gather",)), measured(checksum=7), measured(checksum=9)],
    )
    assert [(e["finding"], e["kind"], e["hosts"]) for e in hw["problem_kinds"]] == [
        ("collectives", "node", ["ls0"]),
        ("matmul", "node", ["ls2"]),
    ]
    floor = verdict([*some[:1], identity(1, host="ls1")], [measured()] * 2, min_busbw=1e9)
    assert floor["problem_kinds"][-1]["kind"] == "job"  # no node to name: the links do that


def test_blocking_checks_and_the_link_stage_say_node_with_a_greppable_reason():
    from lockstep.preflight.links.schedule import round_robin
    from lockstep.preflight.links.section import assess

    hosts = ["ls0", "ls1", "ls2", "ls3"]
    cross = [
        {"a": a, "b": b, "rail": 0, "ranks": [a, b], "round": k,
         "gbps": 0.1 if (a, b) in ((1, 3), (3, 1)) else 0.96}
        for rnd in range(2)
        for k, pairs in enumerate(round_robin(4))
        for a, b in pairs
    ]  # fmt: skip
    # the confirmation round: ls2's links measured again, slow again (named only then, #38)
    cross += [{**x, "round": 3} for x in cross if 2 in (x["a"], x["b"])]
    links = assess(hosts=hosts, ranks=[[k] for k in range(4)], local=[0] * 4,
                   cross=cross, timeout_s=5)  # fmt: skip
    assert links["finding"] == "slow_link" and links["kind"] == "node"
    report = verdict([identity(r, host=h) for r, h in enumerate(hosts)], [measured()] * 4,
                     links=links)  # fmt: skip
    assert report["kind"] == "node" and report["finding"] == "slow_link"
    (entry,) = report["problem_kinds"]
    assert entry["reason"] == "lockstep: slow link ls1<->ls3"
    assert [d["host"] for d in report["drain"]] == links["exclude"]  # the ends to leave out
    assert {d["reason"] for d in report["drain"]} == {"lockstep: slow link ls1<->ls3"}
    bad = {"name": "hostname", "status": "fail", "detail": "own hostname 'ls2' does not resolve"}
    ok = {"name": "hostname", "status": "ok", "detail": "resolves"}
    idents = [identity(r, f"ls{r}", checks=[bad if r == 2 else ok]) for r in range(4)]
    got = blocking(idents, "slurm", "gloo", blocking_checks("gloo"))
    assert got["kind"] == "node" and got["drain"] == [
        {"host": "ls2", "reason": "lockstep: hostname check failed"}
    ]
