"""The link stage's schedule and verdict, pure (no process group): the round-robin covers
every pair in disjoint rounds, the sampled schedule stays within 2 log2(N) + 4 rounds, and the
verdict names a slow node (not its partners), a slow link (neither end), or nothing."""

from __future__ import annotations

import random

import pytest

from lockstep.preflight.links import schedule, section, stats, verdict


def measure(rounds, *, slow_nodes=(), slow_links=(), noise=0.05, seed=0, offset=0):
    rng = random.Random(seed)
    out = []
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            g = 100 * max(0.05, rng.gauss(1.0, noise))
            if a in slow_nodes or b in slow_nodes:
                g /= 5
            if (min(a, b), max(a, b)) in slow_links:
                g /= 5
            out.append({"a": a, "b": b, "gbps": g, "rail": 0, "ranks": [a, b], "round": offset + k})
    return out


def staged(n, *, min_link_gbps=None, seed=0, **planted):
    """The full matrix as the stage measures it: the round-robin, then the confirmation rounds
    (the links that looked slow, measured again: `schedule.confirm_rounds`)."""
    first = measure(schedule.round_robin(n), seed=seed, **planted)
    plan = schedule.confirm_rounds(n, first, min_link_gbps=min_link_gbps)
    return first + measure(plan, seed=seed + 1, offset=len(first), **planted)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 31, 32])
def test_round_robin_measures_every_pair_once_in_disjoint_rounds(n):
    kind, rounds = schedule.schedule(n)
    assert kind == "full"
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))


@pytest.mark.parametrize("n", [33, 100, 1024])
def test_sampled_schedule_is_disjoint_and_within_budget(n):
    kind, first = schedule.schedule(n)
    assert kind == "sampled"
    second = schedule.second_pass(n, [0, 5, 7])
    # the first pass, as many confirmation rounds as there can be, the second pass
    assert len(first) + schedule.CONFIRM_ROUNDS + len(second) <= schedule.budget(n)
    for r in first + second:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
        assert len(r) >= n // 2 - 3
    assert schedule.first_pass(n, seed=0) == first  # the same schedule on every rank


@pytest.mark.parametrize("n", [4, 8])
def test_clean_full_matrix_names_nothing(n):
    for seed in range(20):
        v = verdict.judge(n, measure(schedule.round_robin(n), seed=seed, noise=0.05))
        assert v["slow_nodes"] == [] and v["slow_links"] == [] and v["exclude"] == []


@pytest.mark.parametrize("n,slow", [(3, 2), (4, 2), (8, 5)])
def test_slow_node_named_not_its_partners(n, slow):
    v = verdict.judge(n, staged(n, slow_nodes={slow}))
    assert [s["node"] for s in v["slow_nodes"]] == [slow]
    assert v["slow_links"] == [] and v["exclude"] == [slow]


def test_two_slow_nodes_in_four():
    v = verdict.judge(8, staged(8, slow_nodes={1, 6}))
    assert sorted(s["node"] for s in v["slow_nodes"]) == [1, 6] and v["slow_links"] == []


def test_slow_link_names_both_ends_and_neither_node():
    v = verdict.judge(4, staged(4, slow_links={(1, 2)}))
    assert v["slow_nodes"] == []
    assert [(s["a"], s["b"]) for s in v["slow_links"]] == [(1, 2)]
    assert set(v["exclude"]) <= {1, 2} and v["exclude"]


def test_slow_link_exclude_takes_the_end_whose_other_links_are_slower():
    links = staged(8, slow_links={(2, 5)}, noise=0.0)
    for x in links:  # node 5's other links are fine but clearly slower than node 2's
        if 5 in (x["a"], x["b"]) and 2 not in (x["a"], x["b"]):
            x["gbps"] = 85.0
    v = verdict.judge(8, links)
    assert [(s["a"], s["b"]) for s in v["slow_links"]] == [(2, 5)]
    assert v["exclude"] == [5]


def test_two_nodes_one_link_needs_the_floor():
    links = staged(2)
    assert verdict.judge(2, links)["exclude"] == []
    v = verdict.judge(2, staged(2, min_link_gbps=1000), min_link_gbps=1000)
    assert [(s["a"], s["b"]) for s in v["slow_links"]] == [(0, 1)] and v["exclude"] == [0, 1]


def test_min_link_gbps_adds_an_absolute_floor():
    v = verdict.judge(4, staged(4, noise=0.0, min_link_gbps=200), min_link_gbps=200)
    assert sorted(s["node"] for s in v["slow_nodes"]) != [] or v["slow_links"]


def test_sampled_schedule_finds_slow_nodes_at_1024():
    n, slow = 1024, {3, 400, 777}
    _, first = schedule.schedule(n)
    links = measure(first, slow_nodes=slow)
    second = schedule.second_plan(n, links, sampled=True)  # confirmation, second pass
    links += measure(second, slow_nodes=slow, seed=1, offset=len(first))
    v = verdict.judge(n, links)
    assert sorted(s["node"] for s in v["slow_nodes"]) == sorted(slow)
    assert v["slow_links"] == []


def test_assess_names_hosts_ranks_and_the_hostlist():
    hosts = [f"node{k}" for k in range(4)]
    ranks = [[2 * k, 2 * k + 1] for k in range(4)]
    local = [0, 1] * 4
    cross = []
    for x in staged(4, slow_nodes={3}):
        for rail in (0, 1):
            a, b = x["a"], x["b"]
            cross.append({**x, "rail": rail, "ranks": [ranks[a][rail], ranks[b][rail]]})
    out = section.assess(hosts=hosts, ranks=ranks, local=local, cross=cross, silent=[], timeout_s=5)
    assert out["finding"] == "slow_node" and out["kind"] == "node" and out["exit_code"] == 1
    assert {(s["host"], s["local_rank"]) for s in out["slow_nodes"]} == {
        ("node3", 0),
        ("node3", 1),
    }
    assert out["exclude_hostlist"] == "node3"
    assert "slow node node3 local rank 1 (rank 7)" in " ".join(out["problems"])
    gone = section.assess(
        hosts=hosts, ranks=ranks, local=local, cross=[], silent=[4, 5], timeout_s=5
    )
    assert gone["finding"] == "dropped" and gone["kind"] == "node" and gone["exit_code"] == 3
    assert gone["exclude_hostlist"] == "node2" and "node2" in gone["problems"][0]


def test_verdict_at_4096_nodes_is_fast():
    import time

    n = 4096
    _, first = schedule.schedule(n)
    links = measure(first, slow_nodes={1, 2000})
    links += measure(schedule.second_plan(n, links, sampled=True), slow_nodes={1, 2000}, seed=1)
    start = time.process_time()
    v = verdict.judge(n, links)
    assert time.process_time() - start < 1  # about 0.05 s (benchmarks/bench_links.py)
    assert sorted(s["node"] for s in v["slow_nodes"]) == [1, 2000]


def test_best_of_keeps_each_pairs_fastest_measurement():
    links = [
        {"a": 1, "b": 0, "gbps": 40.0, "rail": 0, "round": 1},
        {"a": 0, "b": 1, "gbps": 95.0, "rail": 0, "round": 4},
        {"a": 0, "b": 1, "gbps": 90.0, "rail": 1, "round": 1},
        {"a": 0, "b": 1, "gbps": 70.0, "rail": 0, "round": 5},
    ]
    assert stats.best_of(links) == [
        {
            "a": 0,
            "b": 1,
            "gbps": 95.0,
            "rail": 0,
            "round": 4,
            "measurements": 3,
            "gbps_worst": 40.0,
        },
        {
            "a": 0,
            "b": 1,
            "gbps": 90.0,
            "rail": 1,
            "round": 1,
            "measurements": 1,
            "gbps_worst": 90.0,
        },
    ]
    assert stats.best_of(stats.best_of(links)) == stats.best_of(links)  # merged: unchanged


def test_confirmation_measures_the_slow_links_again_isolated_ones_first():
    n = 8
    assert (
        schedule.confirm_rounds(n, measure(schedule.round_robin(n))) == []
    )  # clean: no round added
    links = measure(schedule.round_robin(n), slow_nodes={6}, slow_links={(1, 2)})
    rounds = schedule.confirm_rounds(n, links)
    assert len(rounds) == schedule.CONFIRM_ROUNDS
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert rounds[0][0] == (1, 2)  # the isolated slow link, before the slow node's seven
    assert all(6 in p for r in rounds for p in r[1 if r is rounds[0] else 0 :])
    assert schedule.second_plan(n, links, sampled=False) == rounds


def test_within_the_full_matrix_every_link_in_doubt_is_measured_again():
    """The CI run of 0561f13: eight nodes, the ls3-ls6 link at a fifth of the rate, and a loaded
    host's readings putting four more links of ls3 and ls6 in doubt. Two confirmation rounds
    held the four (their ends had fewer other slow links) and not ls3-ls6, which then stayed
    unconfirmed (not judged) and the run passed. Within the full matrix every link in doubt is
    measured again; the four come back fine and ls3-ls6 is named, as a link."""
    n = 8
    noisy = {(0, 3), (1, 3), (2, 6), (4, 6)}
    first = measure(schedule.round_robin(n), slow_links={(3, 6)}, noise=0.02)
    for x in first:
        if (x["a"], x["b"]) in noisy:
            x["gbps"] *= 0.6
    two = schedule.confirm_rounds(n, first, rounds=schedule.CONFIRM_ROUNDS)
    assert (3, 6) not in [p for r in two for p in r]  # what two rounds held
    plan = schedule.second_plan(n, first, sampled=False)
    assert sorted(p for r in plan for p in r) == sorted(noisy | {(3, 6)}) and len(plan) == 3
    for r in plan:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    again = measure(plan, slow_links={(3, 6)}, noise=0.02, seed=1, offset=n - 1)
    hosts, ranks, local = [f"n{k}" for k in range(n)], [[k] for k in range(n)], [0] * n
    cross = [{**x, "ranks": [x["a"], x["b"]]} for x in first + again]
    out = section.assess(hosts=hosts, ranks=ranks, local=local, cross=cross, timeout_s=5)
    assert out["exit_code"] == 1 and out["slow_nodes"] == [] and out["not_judged"] == []
    assert [x["hosts"] for x in out["slow_links"]] == [["n3", "n6"]]


def test_the_confirmation_fits_the_plan_a_rank_sizes_for():
    """Within the full matrix the confirmation covers every pair kept, in at most N rounds (the
    broadcast plan's size: `plan_rounds`), also when every link is in doubt."""
    for n in range(2, schedule.FULL_MATRIX + 1):
        first = measure(schedule.round_robin(n), noise=0.02)
        for x in first:
            x["gbps"] *= 0.1 if (x["a"] + x["b"]) % 2 else 1.0
        plan = schedule.second_plan(n, first, sampled=False)
        assert len(plan) <= schedule.plan_rounds(n, sampled=False) == max(2, n)
        merged = stats.best_of(first)
        doubt = schedule.doubtful(n, merged, None)
        wanted = {(x["a"], x["b"]) for x, d in zip(merged, doubt, strict=True) if d}
        got = [p for r in plan for p in r]
        assert set(got) <= wanted and len(got) == len(set(got))
        degree = {k: sum(k in p for p in wanted) for k in range(n)}
        for pair in wanted - set(got):  # left out only at a node mostly in doubt, kept twice
            assert any(
                2 * degree[e] > n - 1 and sum(e in p for p in got) == schedule.NODE_CONFIRMS
                for e in pair
            ), (n, pair)


def test_one_slowed_transfer_confirmed_away_a_slow_link_confirmed():
    """A link slowed once (a busy host) is fine when measured again: no finding. A slow link
    is slow again: named. The verdict takes each pair's best measurement (assess)."""
    n = 4
    hosts, ranks, local = [f"n{k}" for k in range(n)], [[k] for k in range(n)], [0] * n

    def assessed(links):
        cross = [{**x, "ranks": [x["a"], x["b"]]} for x in links]
        return section.assess(hosts=hosts, ranks=ranks, local=local, cross=cross, timeout_s=5)

    def confirmed(links, **slow):
        return [
            {**x, "round": 3 + x["round"]}
            for x in measure(schedule.confirm_rounds(n, links), **slow)
        ]

    once = measure(schedule.round_robin(n), slow_links={(0, 3)})
    again = confirmed(once, seed=1)
    assert [p for r in schedule.confirm_rounds(n, once) for p in r] == [(0, 3)]
    alone = assessed(once)  # one measurement alone: in doubt, never named
    assert alone["finding"] is None and alone["exit_code"] == 0
    assert [(x["hosts"], x["why"]) for x in alone["not_judged"]] == [(["n0", "n3"], "unconfirmed")]
    clean = assessed(once + again)
    assert clean["kind"] is None and clean["exit_code"] == 0 and clean["rounds"] == 4
    assert [x["measurements"] for x in clean["links"] if (x["a"], x["b"]) == (0, 3)] == [2]
    slow_again = confirmed(once, slow_links={(0, 3)}, seed=1)
    named = assessed(once + slow_again)
    assert named["finding"] == "slow_link" and named["slow_links"][0]["hosts"] == ["n0", "n3"]


def test_cpu_measures_local_rank_0_between_nodes_every_rank_within():
    from lockstep.preflight.links.layout import Layout, plan_partner

    lay = Layout(hosts=["a", "b"], ranks=[[0, 1], [2, 3]], local=[0, 1, 0, 1])
    assert [plan_partner(lay, r, [(0, 1)]) for r in range(4)] == [2, 3, 0, 1]  # every rail
    assert [plan_partner(lay, r, [(0, 1)], rails=1) for r in range(4)] == [2, None, 0, None]
    assert [plan_partner(lay, r, None, rails=1) for r in range(4)] == [1, 0, 3, 2]


def _assess4(links):
    n = 4
    hosts, ranks, local = [f"n{k}" for k in range(n)], [[k] for k in range(n)], [0] * n
    cross = [{**x, "ranks": [x["a"], x["b"]]} for x in links]
    return section.assess(hosts=hosts, ranks=ranks, local=local, cross=cross, timeout_s=5)


def test_starved_links_are_not_judged_never_named():
    """A node whose rank was starved of CPU in every transfer: its links read slow, but the
    verdict names no slow node or link on them; they are reported as not judged (section,
    warnings) and the run passes. The same readings unstarved name the node."""
    slow = _assess4(staged(4, slow_nodes={2}, noise=0.02))
    assert [s["host"] for s in slow["slow_nodes"]] == ["n2"] and slow["exit_code"] == 1
    links = measure(schedule.round_robin(4), slow_nodes={2}, noise=0.02)
    for x in links:
        if 2 in (x["a"], x["b"]):
            x.update(starved=0.8, reps=6, starved_reps=6, extra_reps=4, cpu_wait_known=True)
        else:
            x.update(reps=2, starved_reps=0, extra_reps=0, cpu_wait_known=True)
    out = _assess4(links)
    assert out["slow_nodes"] == [] and out["slow_links"] == [] and out["exclude"] == []
    assert out["kind"] is None and out["exit_code"] == 0 and out["problems"] == []
    assert sorted(tuple(x["hosts"]) for x in out["not_judged"]) == [
        ("n0", "n2"),
        ("n1", "n2"),
        ("n2", "n3"),
    ]
    assert all(x["starved"] == 0.8 and x["gbps"] < 30 for x in out["not_judged"])
    assert len(out["warnings"]) == 3 and "not judged: CPU-starved" in out["warnings"][0]
    assert "80% of the transfer" in out["warnings"][0]
    assert out["typical_gbps"] > 90  # the judged links alone
    assert out["cpu_wait"] == {
        "threshold": stats.STARVED_FRACTION,
        "reps": 3 * 6 + 3 * 2,
        "starved_reps": 18,
        "extra_reps": 12,
        "starved_links": 3,
        "known": True,
    }
    assert out["rails"][0]["starved"] == 3 and out["rails"][0]["links"] == 6
    # the table (terminal and step summary) says so, slowest first: ls2's three links
    from lockstep.preflight import report

    lines = report.links_markdown(out)
    assert "3 not judged (3 CPU-starved)" in lines[1]
    rows = [line for line in lines if line.startswith("| n")]
    assert [r.endswith("| not judged (CPU-starved) |") for r in rows] == [True] * 3 + [False] * 3


def test_a_starved_link_that_reads_fast_is_fine_and_one_unstarved_reading_judges():
    links = measure(schedule.round_robin(4), slow_links={(0, 3)}, noise=0.02)
    for x in links:
        if (x["a"], x["b"]) in ((0, 1), (0, 3)):
            x["starved"] = 0.5  # (0, 1) fast all the same: a lower bound that clears the bar
    out = _assess4(links)
    assert out["not_judged"] and [x["hosts"] for x in out["not_judged"]] == [["n0", "n3"]]
    assert out["kind"] is None and out["warnings"]
    again = [
        {**x, "round": 9, "gbps": x["gbps"] * 0.9} for x in links if (x["a"], x["b"]) == (0, 3)
    ]
    for x in again:
        x.pop("starved")  # measured again with both ends on a CPU: still slow
    named = _assess4(links + again)
    assert named["finding"] == "slow_link" and named["not_judged"] == []
    assert [s["hosts"] for s in named["slow_links"]] == [["n0", "n3"]]


def _starve(links, pair, fraction):
    """Link `pair`'s readings starved of CPU by `fraction` in every transfer, with the ceiling
    such waits leave (`bandwidth`: starvation slows a transfer by at most the time waited)."""
    for x in links:
        if (x["a"], x["b"]) == pair:
            x.update(starved=fraction, gbps_ceiling=x["gbps"] / (1 - fraction))


def test_a_starved_link_of_a_slow_node_is_judged_when_its_waits_cannot_explain_it():
    """The bed under load in CI (test_links, three busy loops, -n 3 beside it): the tbf-slowed
    node's link to n3 read at a fifth (tc's rate) in every transfer, its ends woken for every
    tbf burst and waiting for a CPU half of each transfer: starved. Half the time waited cannot
    make a link at the typical speed read a fifth of it (at most twice the reading, far below
    the threshold), so the link is judged with the others. Before the ceiling it was reported
    as not judged (CPU-starved) beside the slow node."""
    links = staged(4, slow_nodes={2}, noise=0.02)
    _starve(links, (2, 3), 0.5)
    out = _assess4(links)
    assert [s["host"] for s in out["slow_nodes"]] == ["n2"] and out["exit_code"] == 1
    assert out["not_judged"] == [] and out["slow_links"] == [] and out["exclude"] == ["n2"]
    (node,) = out["slow_nodes"]
    assert node["slow_links"] == 3


def test_a_starved_link_whose_waits_could_explain_it_stays_unjudged():
    """Waits of 80% of every transfer: the link could be five times its reading, the typical
    speed: not judged, with what it could be and the bar it is held against; with no bound at
    all (waits as long as the transfer: no ceiling) the same."""
    for ceiling in ("waits", None):
        links = staged(4, slow_links={(0, 3)}, noise=0.02)
        _starve(links, (0, 3), 0.8)
        if ceiling is None:
            for x in links:
                if (x["a"], x["b"]) == (0, 3):
                    x["gbps_ceiling"] = None
        out = _assess4(links)
        assert out["kind"] is None and out["exit_code"] == 0 and out["slow_links"] == []
        (row,) = out["not_judged"]
        assert row["hosts"] == ["n0", "n3"] and row["why"] == "starved"
        assert row["threshold_gbps"] > row["gbps"] and row["min_margin_gbps"] > 0
        if ceiling is None:
            assert row["gbps_ceiling"] is None and "no bound without those waits" in str(out)
        else:
            assert row["gbps_ceiling"] >= row["threshold_gbps"] - row["min_margin_gbps"]
            assert f"up to {row['gbps_ceiling']} without those waits" in out["warnings"][0]


def test_best_of_keeps_the_higher_ceiling_of_starved_measurements():
    a = {"a": 0, "b": 1, "rail": 0, "round": 0, "gbps": 40.0, "starved": 0.7, "gbps_ceiling": 90}
    b = {"a": 0, "b": 1, "rail": 0, "round": 3, "gbps": 45.0, "starved": 0.4, "gbps_ceiling": 75}
    c = {"a": 0, "b": 1, "rail": 0, "round": 4, "gbps": 35.0, "starved": 0.9, "gbps_ceiling": None}
    d = {"a": 0, "b": 1, "rail": 0, "round": 5, "gbps": 30.0}
    merged = stats.best_of([a, b])[0]
    assert merged["gbps"] == 45.0 and merged["gbps_ceiling"] == 90  # the most it could be
    assert stats.best_of([a, b, c])[0]["gbps_ceiling"] is None  # one with no bound: none
    merged = stats.best_of([a, d])[0]
    assert "starved" not in merged and "gbps_ceiling" not in merged


def test_best_of_keeps_starved_only_when_every_measurement_was():
    a = {"a": 0, "b": 1, "rail": 0, "round": 0, "gbps": 40.0, "starved": 0.7}
    b = {"a": 0, "b": 1, "rail": 0, "round": 3, "gbps": 35.0}
    c = {"a": 0, "b": 1, "rail": 0, "round": 4, "gbps": 45.0, "starved": 0.4}
    merged = stats.best_of([a, b])[0]
    assert merged["gbps"] == 40.0 and "starved" not in merged  # b was not starved
    merged = stats.best_of([a, c])[0]
    assert merged["gbps"] == 45.0 and merged["starved"] == 0.4 and merged["measurements"] == 2


def test_starved_slow_links_are_measured_again():
    n = 4
    links = measure(schedule.round_robin(n), slow_links={(1, 2)}, noise=0.0)
    for x in links:
        if (x["a"], x["b"]) == (1, 2):
            x["starved"] = 0.6
    assert [p for r in schedule.confirm_rounds(n, links) for p in r] == [(1, 2)]
    assert schedule.suspects(n, links) == [1, 2]


def test_pair_links_marks_a_link_starved_by_its_slower_direction():
    from lockstep.preflight.links.layout import Layout
    from lockstep.preflight.links.pairing import pair_links

    lay = Layout(hosts=["a", "b", "c"], ranks=[[0], [1], [2]], local=[0, 0, 0])
    rec = {"latency_us": 50.0, "round": 0, "intra": False, "reps": 2, "extra_reps": 0}
    records = {
        0: [
            {
                **rec,
                **{"peer": 1, "gbps_out": 0.5, "starved": 0.6, "starved_reps": 6, "reps": 6},
                "gbps_ceiling_out": 1.25,
            }
        ],
        1: [
            {**rec, "peer": 0, "gbps_out": 0.9, "starved_reps": 0},
            {**rec, "round": 1, "peer": 2, "gbps_out": 0.5, "starved_reps": 0},
        ],
        2: [{**rec, "round": 1, "peer": 1, "gbps_out": 0.4, "starved": 0.3, "starved_reps": 2}],
    }
    cross, intra = pair_links(lay, records)
    assert intra == []
    first, second = cross
    assert first["gbps"] == 0.5 and first["starved"] == 0.6  # the slower way was starved
    assert first["gbps_ceiling"] == 1.25  # and the most its waits leave it
    assert second["gbps_ceiling"] is None  # that way's transfers gave no bound
    assert first["reps"] == 8 and first["starved_reps"] == 6
    assert second["gbps"] == 0.4 and second["starved"] == 0.3
    records[1][1]["gbps_out"] = 0.4  # the other way as slow, unstarved: the reading stands
    assert "starved" not in pair_links(lay, records)[0][1]


def test_pairing_kept_between_passes_builds_the_links_of_every_record():
    """Rank 0 keeps the first pass's links for the end (`Pairing`): after a second pass's
    records are added, the links are those of pairing every record at once."""
    from lockstep.preflight.links.layout import Layout
    from lockstep.preflight.links.pairing import Pairing, pair_links

    lay = Layout(hosts=["a", "b", "c"], ranks=[[0, 3], [1, 4], [2, 5]], local=[0, 0, 0, 1, 1, 1])
    rng = random.Random(3)

    def rec(peer, rnd, intra=False):
        return {"peer": peer, "round": rnd, "intra": intra, "gbps_out": rng.uniform(1, 2)}

    records = {0: [rec(1, 0), rec(3, 1, True)], 1: [rec(0, 0)], 3: [rec(0, 1, True)], 2: []}
    kept = Pairing(lay)
    first = kept.links(records)
    assert first == pair_links(lay, records) and len(first[0]) == len(first[1]) == 1
    records[0].append(rec(2, 2))  # the second pass: new rounds, one direction missing
    records[2].append(rec(0, 2))
    records[4] = [rec(5, 3)]
    assert kept.links(records) == pair_links(lay, records)
    assert [x["round"] for x in kept.links(records)[0]] == [0, 2, 3]
    records[0].pop()
    with pytest.raises(ValueError, match="rank 0 has fewer link records"):
        kept.links(records)


def test_cpu_wait_merges_a_misplaced_intra_reading_with_its_cross_link():
    """The report's starved-link count merges every measurement of a pair and rail, cross and
    intra alike: a record that says intra for a peer on another node still merges (its
    unstarved reading clears the starved one)."""
    base = {"rail": 0, "ranks": [0, 1], "gbps": 50.0}
    cross = [{**base, "a": 0, "b": 1, "round": 1, "starved": 0.5}]
    intra = [{**base, "a": 0, "b": 1, "round": 0}]
    got = section.assess(hosts=["n0", "n1"], ranks=[[0], [1]], local=[0, 0], cross=cross,
                         intra=intra)  # fmt: skip
    assert got["cpu_wait"]["starved_links"] == 0
    got = section.assess(hosts=["n0", "n1"], ranks=[[0], [1]], local=[0, 0], cross=cross)
    assert got["cpu_wait"]["starved_links"] == 1


def test_every_link_starved_only_the_outlier_goes_unjudged():
    """A machine so loaded that every transfer was starved: the readings are lower bounds;
    those that agree with one another are fine, the one far below them is not judged, and
    nothing is named."""
    links = measure(schedule.round_robin(4), slow_links={(1, 3)}, noise=0.02)
    for x in links:
        x["starved"] = 0.4
    out = _assess4(links)
    assert out["kind"] is None and out["exit_code"] == 0 and out["problems"] == []
    assert [x["hosts"] for x in out["not_judged"]] == [["n1", "n3"]]
    assert out["typical_gbps"] > 90  # the starved readings that agree: lower bounds above it
    assert out["not_judged"][0]["typical_gbps"] > 90  # the starved readings' own


def test_a_slow_node_is_named_when_the_fast_links_were_starved():
    """The bed under load (test_links, three busy loops, -n 3 beside it): the tbf-slowed node's
    transfers take long enough that their ends' waits stay under the starved fraction, while the
    other links' short transfers were starved in every measurement. Their readings are lower
    bounds above the bar: judged with the rest, so the slow node is named (left out, the slow
    node's own links set the typical, 0.195 Gb/s, and nothing was)."""
    links = staged(4, slow_nodes={2}, noise=0.02)
    for x in links:
        if 2 not in (x["a"], x["b"]):
            x.update(starved=0.5)
    out = _assess4(links)
    assert [s["host"] for s in out["slow_nodes"]] == ["n2"] and out["exit_code"] == 1
    assert out["not_judged"] == [] and out["typical_gbps"] > 90


# ---------------------------------------------------------------- no false slow node (issue 38)


def _readings(n, values, spread=0.0):
    """Links from {(a, b): [Gb/s per measurement]} (the measurements in successive rounds),
    each measurement's slowest transfer `spread` below its best (`gbps_low`)."""
    out = []
    for (a, b), gbps in values.items():
        for k, g in enumerate(gbps):
            x = {"a": a, "b": b, "gbps": g, "gbps_low": g * (1 - spread), "rail": 0}
            out.append({**x, "ranks": [a, b], "round": k * n + a})
    return out


# The 4-node bed unshaped (veth on one bridge, CPU-bound readings of 11-20 Gb/s), as the issue
# saw it: ls2's two links at ~11.8 Gb/s in both measurements, the rest ~16.6; the transfers of
# each measurement spread by a third (a CPU-bound link's repeats).
UNSHAPED = {
    (0, 1): [16.2],
    (0, 2): [11.6, 11.9],
    (0, 3): [16.6],
    (1, 2): [11.7, 12.0],
    (1, 3): [17.0],
    (2, 3): [17.1],
}


def test_noisy_unshaped_readings_name_no_slow_node():
    """Before: "slow node ls2: median link 11.8 Gb/s vs typical 16.2 Gb/s (2 of 3 links slow)"
    (2 of 22 runs on the bed). Slow again when measured again, but within the margin below the
    threshold: in doubt, not judged, never named."""
    out = _assess4(_readings(4, UNSHAPED, spread=0.3))
    assert out["slow_nodes"] == [] and out["slow_links"] == [] and out["exclude"] == []
    assert out["finding"] is None and out["exit_code"] == 0 and out["problems"] == []
    doubt = {tuple(x["hosts"]): x for x in out["not_judged"]}
    assert sorted(doubt) == [("n0", "n2"), ("n1", "n2")]
    for x in doubt.values():
        assert x["why"] == "borderline" and x["measurements"] == 2
        assert 0 < x["margin_gbps"] < x["min_margin_gbps"]
    assert out["rails"][0]["min_margin_gbps"] == round(stats.MIN_MARGIN * out["typical_gbps"], 4)
    assert any("not judged: borderline" in w for w in out["warnings"])


def test_a_reading_whose_repeats_spread_wide_is_not_judged():
    """Clear of the threshold but its repeats (transfers, measurements) spread wider than its
    distance below it: noisy, not judged. The same readings steady name the link."""
    values = {**UNSHAPED, (0, 2): [16.4], (1, 2): [16.3], (0, 3): [9.0, 9.4]}
    noisy = _assess4(_readings(4, values, spread=0.5))
    assert noisy["finding"] is None and noisy["exit_code"] == 0
    assert [(x["hosts"], x["why"]) for x in noisy["not_judged"]] == [(["n0", "n3"], "noisy")]
    assert noisy["not_judged"][0]["noise_gbps"] > noisy["not_judged"][0]["margin_gbps"]
    steady = _assess4(_readings(4, values, spread=0.02))
    assert steady["finding"] == "slow_link" and steady["not_judged"] == []
    (link,) = steady["slow_links"]
    assert link["hosts"] == ["n0", "n3"] and link["measurements"] == 2
    assert link["margin_gbps"] >= steady["rails"][0]["min_margin_gbps"] > 0
    assert link["noise_gbps"] < link["margin_gbps"]


def test_one_slow_link_beside_a_noisy_one_names_the_link_not_its_end():
    """Before: with only ls1-ls3 rate-limited, a noisy reading of another ls3 link made ls3
    (2 of 3 links slow) the slow node, and the link was not named (1 of 7 runs on the bed)."""
    values = {
        (0, 1): [16.2],
        (0, 2): [16.5],
        (0, 3): [11.8, 12.0],  # ls3's other link, noisy
        (1, 2): [17.0],
        (1, 3): [0.095, 0.096],  # 100 Mbit/s
        (2, 3): [16.9],
    }
    out = _assess4(_readings(4, values, spread=0.3))
    assert out["slow_nodes"] == [] and out["finding"] == "slow_link"
    assert [x["hosts"] for x in out["slow_links"]] == [["n1", "n3"]]
    assert [x["hosts"] for x in out["not_judged"]] == [["n0", "n3"]]


def test_a_single_slow_link_never_makes_its_end_a_slow_node():
    """Three nodes: each has two links, so one slow link is half of its ends' links; a share
    over half needs two slow links of the node, two partners."""
    values = {(0, 1): [10.0], (0, 2): [1.0, 1.1], (1, 2): [10.2]}
    v = verdict.judge(3, _readings(3, values, spread=0.01))
    assert v["slow_nodes"] == [] and [(s["a"], s["b"]) for s in v["slow_links"]] == [(0, 2)]


@pytest.mark.parametrize("typical", [16.0, 1.0])  # unshaped, and the bed's 1 Gbit/s
def test_planted_slow_node_and_slow_link_still_named(typical):
    """A node at 40 Mbit/s and a link at 100 Mbit/s, through the stage's plan (first pass,
    confirmation rounds), with the noise of the bed: named right, the link as a link."""
    scale = typical / 100
    for seed in range(10):
        node = staged(4, slow_nodes={2}, noise=0.1, seed=seed)
        link = staged(4, slow_links={(1, 3)}, noise=0.1, seed=seed)
        for links, slow in ((node, 0.04), (link, 0.1)):
            for x in links:
                x["gbps"] *= scale
                if x["gbps"] < typical / 2:  # the planted rate, steady (tbf or htb)
                    x["gbps"] = slow * rng_jitter(seed, x["round"])
                x["gbps_low"] = x["gbps"] * 0.97
        v_node, v_link = verdict.judge(4, node), verdict.judge(4, link)
        assert [s["node"] for s in v_node["slow_nodes"]] == [2] and v_node["slow_links"] == []
        assert v_node["slow_nodes"][0]["confirmed"] >= 1
        assert v_node["slow_nodes"][0]["margin_gbps"] > v_node["min_margin_gbps"]
        assert v_link["slow_nodes"] == []
        assert [(s["a"], s["b"]) for s in v_link["slow_links"]] == [(1, 3)]


def rng_jitter(seed, k):
    return random.Random(seed * 100 + k).uniform(0.95, 1.0)


def test_a_slow_node_whose_links_alone_were_not_starved_is_measured_again_and_named():
    """The bed unshaped with ls2 at 40 Mbit/s: every healthy link CPU-bound and starved, ls2's
    long transfers not. Before, the confirmation took the bar from the unstarved readings
    alone (ls2's own), so nothing looked slow, nothing was measured again, and the node stayed
    unconfirmed (7 of 10 runs on the bed)."""
    first = staged(4, slow_nodes=set(), noise=0.1)[:6]
    for x in first:
        if 2 in (x["a"], x["b"]):
            x.update(gbps=0.0394, gbps_low=0.0383)
        else:
            x.update(gbps=x["gbps"] * 0.12, gbps_low=x["gbps"] * 0.02, starved=0.6)
    plan = schedule.confirm_rounds(4, first)
    assert sorted(p for r in plan for p in r) == [(0, 2), (1, 2)]  # two rounds: ls2 in each
    again = [
        {**x, "round": 3 + k} for k, r in enumerate(plan) for x in first if (x["a"], x["b"]) in r
    ]
    out = _assess4(first + again)
    assert [s["host"] for s in out["slow_nodes"]] == ["n2"] and out["exit_code"] == 1
    assert out["slow_nodes"][0]["confirmed_links"] == 2 and out["slow_links"] == []


def test_gc_paused_turns_collection_back_on_as_it_was():
    """Rank 0's bulk link work pauses the cyclic collector (`links.bulk`): on again after,
    an exception included; off where it was off; a nested pause leaves it to the outer one."""
    import gc

    from lockstep.preflight.links.bulk import gc_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
        raise RuntimeError("the work failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
