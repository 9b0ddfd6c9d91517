"""A local check and a link measurement added from outside lockstep, on real ranks: a module
of the user's own registers them (`local.registry.register`, `links.measure.register`) in
each rank's process before `lockstep.cli.main(["preflight", ...])`, as a launcher script
importing it would (each rank forked, `by_hand(preload=...)`); the report shows the check's
row (a failure fails the run and names the rank) and the measurement's field on each link."""

from __future__ import annotations

import json

from support.preflight_ranks import by_hand, finish

EXTRAS = '''
import os

from lockstep.preflight.links.measure import LinkMeasurement
from lockstep.preflight.links.measure import register as register_measurement
from lockstep.preflight.local.check import LocalCheck, result
from lockstep.preflight.local.registry import register as register_check


def scratch_space(info, torch):
    """The site's own check: rank 1 is told its scratch is missing."""
    if os.environ.get("SITE_SCRATCH_MISSING") == str(info.rank):
        return result("site_scratch", "fail", f"/scratch missing on rank {info.rank}")
    return result("site_scratch", "ok", "/scratch mounted")


def echo(pair):
    """Each side sends the rank it believes its peer has; each reads back its own."""
    mine, got = pair.floats(1, float(pair.peer)), pair.floats(1)
    if pair.first:
        pair.dist.send(mine, pair.peer)
        pair.dist.recv(got, pair.peer)
    else:
        pair.dist.recv(got, pair.peer)
        pair.dist.send(mine, pair.peer)
    pair.sync()
    return {"echoed_rank": int(got.item())}


register_check(LocalCheck("site_scratch", scratch_space))
register_measurement(LinkMeasurement("echo", echo, carry=("echoed_rank",)))
'''


def test_a_check_and_a_measurement_registered_from_outside_reach_the_report(tmp_path):
    (tmp_path / "site_extras.py").write_text(EXTRAS)
    report_path = tmp_path / "report.json"
    _, procs = by_hand(
        2,
        [0, 1],
        tmp_path,
        args=["--timeout", "60", "--json", str(report_path), "--links"],
        per_rank_env={1: {"SITE_SCRATCH_MISSING": "1"}},
        preload="site_extras",  # registers the check and the measurement
    )
    results = finish(procs)
    assert {r: res["rc"] for r, res in results.items()} == {0: 1, 1: 1}, results

    report = json.loads(report_path.read_text())
    (row,) = [c for c in report["checks"] if c["name"] == "site_scratch"]
    assert row["status"] == "fail" and row["ranks"] == "1"
    assert row["detail"] == "/scratch missing on rank 1"
    assert report["finding"] == "check" and report["findings"] == ["check"]
    assert any(p.startswith("site_scratch on ") and "rank 1:" in p for p in report["problems"])
    assert "site_scratch" in results[0]["out"]  # the table's row

    (link,) = report["links"]["intra"]  # --links on one host: ranks 0 and 1 within the node
    assert link["ranks"] == [0, 1] and link["echoed_rank"] == 0  # from rank 0's record
    assert link["gbps"] > 0 and link["latency_us"] is not None  # the built-in ones still ran
