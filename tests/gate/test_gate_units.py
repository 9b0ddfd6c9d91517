"""The gate's parts without processes: statistics, environment keys, the golden file, the
comparison rules, alert rules, reports, plots and the A/B verdict, on constructed runs."""

import json
import math
import subprocess
import xml.etree.ElementTree as ET
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from lockstep import alerts
from lockstep.cli import main
from lockstep.errors import UsageError
from lockstep.gate import ab, envkey, golden, report, stats
from lockstep.gate.compare import compare
from lockstep.gate.plot import plot_all
from lockstep.gate.run_result import Run, read_rows, summary

ROOT = Path(__file__).resolve().parents[2]
HEADER = {"name": "unit", "env_key": "k", "machine": "m"}


def run(losses, step_time=0.1, mem=None, start=1, **extra):
    rows = []
    for i, loss in enumerate(losses):
        row = {"step": start + i, "loss": loss, "lr": 0.01, "step_time_s": step_time}
        if mem is not None:
            row["mem_bytes"] = mem(i)
        row.update({k: v[i] for k, v in extra.items()})
        rows.append(row)
    return Run(rows)


# --------------------------------------------------------------------------- statistics


def brute_force_p(x, y):
    """P(U >= u) by enumerating every relabelling (ties impossible in these inputs)."""
    pooled = list(x) + list(y)
    u = sum(a > b for a in x for b in y)
    total = hits = 0
    for idx in combinations(range(len(pooled)), len(x)):
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        hits += sum(a > b for a in xs for b in ys) >= u
    return hits / total


@pytest.mark.parametrize(
    "x,y", [([4, 5, 6], [1, 2, 3]), ([1, 5, 9, 2], [3, 4, 8]), ([1, 2], [3, 4, 5])]
)
def test_mann_whitney_exact_matches_enumeration(x, y):
    assert stats.mann_whitney_greater(x, y) == pytest.approx(brute_force_p(x, y))


def test_mann_whitney_normal_approximation_for_large_samples():
    rng = np.random.default_rng(0)
    same = stats.mann_whitney_greater(rng.normal(size=60), rng.normal(size=60))
    shifted = stats.mann_whitney_greater(rng.normal(1, 1, size=60), rng.normal(size=60))
    assert 0.01 < same < 0.99 and shifted < 1e-6


def test_ratio_interval_covers_the_ratio():
    ratio, low, high = stats.ratio_interval([1.2, 1.21, 1.19, 1.2], [1.0, 1.01, 0.99, 1.0])
    assert ratio == pytest.approx(1.2) and low <= ratio <= high and high - low < 0.1


# --------------------------------------------------------------------------- env keys


def fingerprint(torch="2.13.0+cpu", gpus=(), capability="AVX2"):
    return {
        "sections": {
            "torch": {"version": torch, "cuda": "12.8", "cudnn": 91002, "nccl": "2.27.3"},
            "gpus": {"devices": [{"name": n} for n in gpus]},
            "system": {"cpu_model": "Test CPU", "usable_cores": 2},
            "determinism": {"cpu_capability": capability},
            "packages": {"installed": {"deepspeed": "0.19.8"}},
        }
    }


def test_env_key_holds_the_fields_that_change_numerics():
    job = {"engine": "zero3", "world_size": 8, "precision": "bf16", "deterministic": True}
    gpu = envkey.environment(fingerprint(gpus=["NVIDIA H100 80GB HBM3"] * 8), job)
    assert envkey.key(gpu["key_fields"]) == (
        "nvidia-h100-80gb-hbm3_torch2.13.0+cpu_cuda12.8_cudnn91002_nccl2.27.3_ds0.19.8_zero3_w8"
        "_bf16_det"
    )
    assert gpu["machine"] == "8 x NVIDIA H100 80GB HBM3"
    cpu = envkey.environment(fingerprint(), {"world_size": 2, "deepspeed": False})
    # only what the job uses: no DeepSpeed, and no build tag of torch on a CPU run
    assert envkey.key(cpu["key_fields"]) == "cpu-avx2_torch2.13.0_script_w2"
    assert cpu["key_fields"]["cuda"] is None  # a CPU run's numerics do not depend on CUDA
    assert cpu["legacy_key"] == "cpu-avx2_torch2.13.0+cpu_ds0.19.8_script_w2"
    on_gpu_machine = envkey.environment(
        fingerprint(gpus=["NVIDIA H100 80GB HBM3"]), {"world_size": 1, "device": "cpu"}
    )
    assert envkey.key(on_gpu_machine["key_fields"]).startswith("cpu-avx2_torch2.13.0_ds")


def test_a_golden_under_its_old_key_is_still_found(tmp_path):
    """Goldens recorded before keys held only what the job uses: found, with the rename."""
    from lockstep.gate.job import Job
    from lockstep.gate.workflows import Environment

    plain, with_ds = tmp_path / "train.py", tmp_path / "train_ds.py"
    plain.write_text("import torch\n")
    with_ds.write_text("import deepspeed\n")
    assert not Job(command=f"python {plain}").settings()["deepspeed"]
    assert Job(command=f"python {with_ds}").settings()["deepspeed"]
    fields = envkey.environment(fingerprint(), Job(command=f"python {plain}").settings())
    env = Environment(envkey.key(fields["key_fields"]), fields["key_fields"], "m", {},
                      fields["legacy_key"])  # fmt: skip
    old = golden.golden_path(tmp_path, "demo", fields["legacy_key"])
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    said = []
    assert env.existing(tmp_path, "demo", said.append) == old
    assert said and f"git mv {old} {tmp_path / 'demo' / env.key}.json" in said[0]


def test_nearest_key_names_the_fields_that_differ():
    a = envkey.environment(fingerprint(), {"world_size": 2})["key_fields"]
    b = envkey.environment(fingerprint(torch="2.14.0"), {"world_size": 2})["key_fields"]
    c = envkey.environment(fingerprint(torch="2.14.0", capability="AVX512"), {"world_size": 4})
    near = envkey.nearest(a, {"b": b, "c": c["key_fields"]})
    assert near == ("b", ["torch 2.14.0 → 2.13.0"])  # a CPU run: no build tag


# --------------------------------------------------------------------------- goldens


def test_golden_round_trip_is_exact_and_one_row_per_line(tmp_path):
    losses = [math.pi / k for k in range(1, 6)]
    g = golden.build([run(losses), run(losses), run(losses)], HEADER)
    path = golden.write(g, tmp_path / "g.json")
    back = golden.read(path)
    assert back.centers["loss"].tolist() == losses  # bitwise: repr round-trips
    assert back.header["curves"]["loss"]["exact"] and back.header["curves"]["loss"]["budget"] == 0
    lines = path.read_text().splitlines()
    assert sum(line.lstrip().startswith('{"step"') for line in lines) == 5
    assert not list(tmp_path.glob(".g.json.*"))  # no temporary file left behind


def test_tolerance_comes_from_the_spread_with_a_floor():
    g = golden.build([run([2.0, 1.0]), run([2.02, 1.0]), run([1.98, 1.0])], HEADER)
    tol = g.header["curves"]["loss"]
    assert not tol["exact"] and tol["tol_rel"] == pytest.approx(1.5 * 0.01)
    flat = golden.build([run([2.0, 1.0]), run([2.0 + 1e-9, 1.0])], HEADER)
    assert flat.header["curves"]["loss"]["tol_rel"] == pytest.approx(1e-3)  # the floor


def test_nan_is_refused_at_record_time_and_in_a_golden_file(tmp_path):
    with pytest.raises(UsageError, match="repeat 2, step 2: loss is nan; a golden must be finite"):
        golden.build([run([1.0, 0.5]), run([1.0, float("nan")])], HEADER)
    path = golden.write(golden.build([run([1.0, 0.5])] * 2, HEADER), tmp_path / "g.json")
    path.write_text(path.read_text().replace('"loss": 0.5', '"loss": NaN'))
    with pytest.raises(UsageError, match=r"not a valid golden .*NaN is not allowed"):
        golden.read(path)


def test_steps_must_match_between_repeats():
    with pytest.raises(UsageError, match=r"repeat 2 logged steps 1\.\.3"):
        golden.build([run([1.0, 0.5]), run([1.0, 0.5, 0.4])], HEADER)


def _edited(tmp_path, edit):
    """A golden written by lockstep, then edited by hand as `edit(data)` does."""
    path = golden.write(golden.build([run([1.0, 0.9, 0.8])] * 2, HEADER), tmp_path / "g.json")
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))
    return path


def _set(target, key, value):
    target[key] = value


BROKEN = {
    "row without step": (lambda d: d["rows"][1].pop("step"), 'rows[1] has no "step"'),
    "loss is text": (
        lambda d: _set(d["rows"][2], "loss", "abc"),
        'rows[2] (step 3).loss is "abc", not a number',
    ),
    "loss is true": (
        lambda d: _set(d["rows"][0], "loss", True),
        "rows[0] (step 1).loss is true, not a number",
    ),
    "spread is null": (
        lambda d: _set(d["rows"][0], "spread", None),
        "rows[0] (step 1).spread is null, not an object",
    ),
    "spread value is text": (
        lambda d: _set(d["rows"][0]["spread"], "loss", "x"),
        'rows[0] (step 1).spread.loss is "x", not a number >= 0',
    ),
    "no curves": (lambda d: d.pop("curves"), "curves is missing"),
    "no perf": (lambda d: d.pop("perf"), "perf is missing"),
    "curves is a list": (lambda d: _set(d, "curves", []), "curves is [], not an object"),
    "tolerance is text": (
        lambda d: _set(d["curves"]["loss"], "tol_rel", "1%"),
        'curves.loss.tol_rel is "1%", not a finite number >= 0',
    ),
    "budget is negative": (
        lambda d: _set(d["curves"]["loss"], "budget", -1),
        "curves.loss.budget is -1, not an integer >= 0",
    ),
    "perf center is null": (
        lambda d: _set(d["perf"]["step_time_s"], "center", None),
        "perf.step_time_s.center is null, not a number",
    ),
    "perf threshold both gone": (
        lambda d: _set(d["perf"]["step_time_s"], "threshold_rel", None),
        "perf.step_time_s.threshold_rel and threshold_abs are both missing",
    ),
    "curve metric lost at a step": (
        lambda d: d["rows"][1].pop("loss"),
        "rows[1] (step 2) has no loss, which 'curves' gates",
    ),
    "steps out of order": (
        lambda d: _set(d["rows"][2], "step", 2),
        "rows[2].step is 2, not after the previous row's step 2",
    ),
    "no rows": (lambda d: _set(d, "rows", []), "rows is [], not a list of steps"),
    "gates nothing": (
        lambda d: d.update(curves={}, perf={}),
        "it gates nothing (no curve in 'curves', no gated figure in 'perf')",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_hand_edited_golden_is_one_line_naming_file_and_field(case, tmp_path, capsys):
    """Each of these raised KeyError/TypeError/ValueError in compare, or (curves {} and perf
    {}) passed any run with nothing checked; now `gate compare` exits 2 with one line."""
    edit, field = BROKEN[case]
    path = _edited(tmp_path, edit)
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in (1, 2, 3)))
    assert main(["gate", "compare", str(path), str(metrics)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lockstep"), err
    assert err[0].endswith(
        f"{path}: {field}; fix it or record it again with `lockstep gate refresh`"
    )


def test_a_golden_that_gates_nothing_is_not_written(tmp_path):
    """A job that logs only `step` (and `time`) measured from inside: no curve, no figure."""
    g = golden.build([Run([{"step": 1}, {"step": 2}])] * 2, HEADER)
    with pytest.raises(UsageError, match=r"refusing to write golden .*: it gates nothing"):
        golden.write(g, tmp_path / "g.json")
    assert not list(tmp_path.iterdir())


def test_set_overrides_are_scrubbed_from_the_golden_header(tmp_path):
    """`--set` values land in the committed header (`job.overrides`): secrets in them go."""
    from lockstep.gate import workflows
    from lockstep.gate.job import Job

    sets = ["model.overrides.api_token=hunter2", "logging.run_name=https://me:hunter3@wandb.test/x"]
    job = Job(nproc=1, config=ROOT / "smoke" / "cpu-ddp.toml", overrides=[*sets, "steps=3"])
    env = workflows.Environment("key", {"engine": "ddp"}, "this machine", {})
    g = workflows.build_golden("scrubbed", job, env, [run([1.0, 0.9, 0.8])] * 2)
    text = golden.write(g, tmp_path / "g.json").read_text()
    assert "hunter2" not in text and "hunter3" not in text, text
    overrides = golden.read(tmp_path / "g.json").header["job"]["overrides"]
    assert overrides[0].startswith("model.overrides.api_token=<redacted:")
    assert (
        overrides[1].startswith("logging.run_name=https://<redacted:")
        and "@wandb.test" in overrides[1]
    )
    assert overrides[2] == "steps=3"  # nothing secret: kept as given
    # the record/refresh commands lockstep prints quote the overrides scrubbed too
    printed = job.arguments()
    assert "hunter2" not in printed and "hunter3" not in printed and "--set steps=3" in printed


# --------------------------------------------------------------------------- comparison


def noisy_golden(n=100):
    rng = np.random.default_rng(1)
    base = np.linspace(4.0, 2.0, n)
    runs = [run((base * (1 + rng.normal(0, 0.002, n))).tolist()) for _ in range(3)]
    return golden.build(runs, HEADER), base


def test_budget_allows_one_spike_but_not_two():
    g, base = noisy_golden()
    spiked = base.copy()
    spiked[40] *= 1.2
    one = {f.gate: f for f in compare(g, run(spiked.tolist())) if f.metric == "loss"}
    assert one["curve"].status == "pass"
    spiked[60] *= 1.2
    two = {f.gate: f for f in compare(g, run(spiked.tolist())) if f.metric == "loss"}
    assert two["curve"].failed and two["curve"].step == 41
    assert [p["step"] for p in two["curve"].failing] == [41, 61]
    assert two["curve"].worse is True and "(worse)" in two["curve"].message


def test_window_mean_catches_a_shift_inside_the_band():
    g, _ = noisy_golden()
    tol = g.header["curves"]["loss"]
    assert tol["window_tol_rel"] < 0.5 * tol["tol_rel"]  # window means average the noise away
    shifted = g.centers["loss"] * (1 + 0.8 * tol["tol_rel"])  # every step inside its band
    found = {f.gate: f for f in compare(g, run(shifted.tolist())) if f.metric == "loss"}
    assert found["curve"].status == "pass"
    assert found["window"].failed and "mean over steps 1..10" in found["window"].message


def test_better_than_the_golden_fails_too_and_says_refresh():
    g = golden.build([run([1.0, 0.9, 0.8], step_time=0.1)] * 3, HEADER)
    faster = compare(g, run([1.0, 0.9, 0.8], step_time=0.05))
    (perf,) = [f for f in faster if f.metric == "step_time_s"]
    assert perf.failed and not perf.worse and "refresh it" in perf.message
    slightly = compare(g, run([1.0, 0.9, 0.8], step_time=0.085))
    assert not [f for f in slightly if f.failed]  # 15% better: within twice the 10% threshold


def test_missing_steps_fail_by_name():
    g = golden.build([run([1.0, 0.9, 0.8])] * 2, HEADER)
    (f, *_) = [f for f in compare(g, run([1.0, 0.9])) if f.metric == "loss"]
    assert f.failed and "no step 3" in f.message


def test_memory_growth_and_peak():
    losses = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]  # a run that trains: a flat loss is refused
    g = golden.build([run(losses, mem=lambda i: 1e9 + i * 1e5)] * 3, HEADER)
    leak = compare(g, run(losses, mem=lambda i: 1e9 + i * 5e7))
    assert {f.metric for f in leak if f.failed} == {"mem_bytes", "mem_growth_bytes"}


def test_a_100k_step_golden_compares(tmp_path):
    n = 100_000
    losses = (np.linspace(5, 1, n)).tolist()
    path = golden.write(golden.build([run(losses), run(losses)], HEADER), tmp_path / "big.json")
    metrics = tmp_path / "m.jsonl"
    losses[77_777] += 1e-3
    metrics.write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": v, "lr": 0.01}) + "\n" for i, v in enumerate(losses)
        )
    )
    (f, *_) = [f for f in compare(golden.read(path), Run(read_rows(metrics))) if f.failed]
    assert f.metric == "loss" and f.step == 77_778


# --------------------------------------------------------------------------- alerts


def test_alert_fires_after_its_duration_and_not_before():
    rules = alerts.parse_rules(
        {
            "rule": [
                {"name": "s", "metric": "loss", "when": "above", "threshold": 5, "for_steps": 3},
                {
                    "name": "t",
                    "metric": "loss",
                    "when": "above",
                    "threshold": 5,
                    "for_seconds": 2.5,
                },
                {"name": "nan", "metric": "loss", "when": "nonfinite"},
                {"name": "g", "metric": "gpu_util", "when": "below", "threshold": 0.8},
            ]
        },
        "test",
    )
    losses = [6, 6, 1, 6, 6, 6, 6, float("nan")]
    rows = [
        {"step": i + 1, "loss": v, "time": 100.0 + i, "step_time_s": 1.0}
        for i, v in enumerate(losses)
    ]
    fired, unevaluated = alerts.evaluate(rules, rows)
    # s: steps 4, 5, 6 above (the first run of 2 is too short); t: 2.5 s held from the start of
    # step 4 (t=102) is due at the end of step 6 (t=105, 3 s); nan: at once
    assert [(a.rule, a.step, a.since_step) for a in fired] == [
        ("s", 6, 4),
        ("t", 6, 4),
        ("nan", 8, 8),
    ]
    assert [r.name for r in unevaluated] == ["g"]


def test_shipped_default_rules_and_bad_rules_files(tmp_path):
    names = {r.name for r in alerts.default_rules()}
    assert {
        "loss-nonfinite",
        "loss-high",
        "grad-norm-high",
        "throughput-low",
        "memory-high",
        "gpu-util-low",
        "sync-time-high",
    } <= names
    bad = tmp_path / "rules.toml"
    bad.write_text('[[rule]]\nmetric = "loss"\nwhen = "sideways"\n')
    with pytest.raises(UsageError, match="rule 1: 'when' must be one of above, below, nonfinite"):
        alerts.load_rules(bad)
    with pytest.raises(UsageError, match="alert rules not found: "):
        alerts.load_rules(tmp_path / "missing.toml")


def test_alerts_cli(tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": s, "loss": 12.0, "time": 60.0 * s}) + "\n" for s in range(1, 13)
        )
    )
    assert main(["gate", "alerts", "default", str(metrics)]) == 1
    out = capsys.readouterr().out
    # the first step's start is unknown without step_time_s: 600 s held at the end of step 11
    assert "alert loss-high: loss above 10 for 600 s since step 1 (value 12 at step 11)" in out
    assert "rule gpu-util-low not evaluated: no row has 'gpu_util'" in out


# --------------------------------------------------------------------------- reports


def test_junit_markdown_and_plots(tmp_path, monkeypatch):
    g, base = noisy_golden(30)
    bad = base.copy()
    bad[20:] *= 1.3
    current = run(bad.tolist())
    findings = compare(g, current)
    report.to_junit(tmp_path / "j.xml", "lockstep.gate.unit", findings)
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    failures = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["curve:loss", "window:loss"]
    assert "step 21: value" in failures[0].find("failure").text
    summary_file = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    assert report.step_summary(report.markdown("gate unit | x", findings, ["a note"]))
    md = summary_file.read_text()
    assert md.startswith("### gate unit \\| x: FAILED (2 of") and "| ❌ | curve | loss |" in md
    pngs = plot_all(g, current, findings, tmp_path / "plots")
    assert [p.name for p in pngs] == ["unit-loss.png", "unit-lr.png", "unit-step_time_s.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


# --------------------------------------------------------------------------- A/B


def test_ab_verdict_needs_both_size_and_significance():
    base = [run([1.0] * 6, step_time=t) for t in (0.100, 0.101, 0.099, 0.100, 0.102, 0.098)]
    slow = [run([1.0] * 6, step_time=t * 1.10) for t in (0.100, 0.101, 0.099, 0.100, 0.102, 0.098)]
    tiny = [run([1.0] * 6, step_time=t * 1.02) for t in (0.100, 0.101, 0.099, 0.100, 0.102, 0.098)]
    (c,) = ab.judge(base, slow, threshold=0.05, alpha=0.01)
    assert c.regression and c.ratio == pytest.approx(1.10) and c.p_worse < 0.01
    (c,) = ab.judge(base, tiny, threshold=0.05, alpha=0.01)
    assert not c.regression and c.p_worse < 0.05  # significant but small: not a regression
    noisy = [run([1.0] * 6, step_time=t) for t in (0.09, 0.13, 0.1, 0.12, 0.095, 0.125)]
    (c,) = ab.judge(base, noisy, threshold=0.05, alpha=0.01)
    assert not c.regression  # large on average, not significant


def test_ab_worktree_and_a_bad_ref(tmp_path):
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("base")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "b"], check=True)
    tree = ab.worktree(repo, "HEAD", tmp_path / "wt")
    assert (tree / "f").read_text() == "base"
    ab.remove_worktree(repo, tree)
    assert not tree.exists()
    with pytest.raises(UsageError, match="--base nope: not a commit"):
        ab.worktree(repo, "nope", tmp_path / "wt2")


def test_summary_leaves_out_warmup_steps():
    times = [5.0, 3.0, 0.1, 0.1, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]
    r = Run([{"step": i + 1, "loss": 1.0, "step_time_s": t} for i, t in enumerate(times)])
    assert summary(r)["step_time_s"] == 0.1


def test_a_speed_threshold_too_wide_to_catch_a_regression_is_not_judged(tmp_path, capsys):
    """3 repeats on a loaded machine (0.10, 0.13, 0.16 s a step): a 3 x 23% = 69% threshold
    would pass a 50% slowdown. Not judged (exit 4), naming the threshold and what to do."""
    runs = [run([1.0, 0.9, 0.8], step_time=t) for t in (0.10, 0.13, 0.16)]
    g = golden.build(runs, HEADER)
    assert g.header["perf"]["step_time_s"]["threshold_rel"] > 0.6
    slower = compare(g, run([1.0, 0.9, 0.8], step_time=0.195))
    (perf,) = [f for f in slower if f.metric == "step_time_s"]
    assert perf.status == "not_judged" and not perf.failed
    assert "threshold 69.2%" in perf.message and "--repeats" in perf.message
    path = golden.write(g, tmp_path / "g.json")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in run([1.0, 0.9, 0.8], 0.195).rows))
    report_path = tmp_path / "r.json"
    code = main(["gate", "compare", str(path), str(metrics), "--json", str(report_path)])
    assert code == 4, capsys.readouterr()
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "not_judged" and report["passed"] is False
    assert "not judged: its threshold 69.2%" in capsys.readouterr().out
    # a quiet golden judges the same run, and fails it
    quiet = golden.build([run([1.0, 0.9, 0.8], step_time=0.13)] * 3, HEADER)
    assert [f for f in compare(quiet, run([1.0, 0.9, 0.8], 0.195)) if f.failed]


def test_ab_never_passes_a_broken_run_or_nothing_compared():
    """gate ab judges speed and memory, but a head run that is NaN fails, a base run that
    does not train leaves it not judged, and runs that log no figure compare nothing."""
    from lockstep.gate import ab
    from lockstep.gate.run_result import Run

    def run(losses, step_time=0.1):
        return Run([{"step": i + 1, "loss": x, "step_time_s": step_time}
                    for i, x in enumerate(losses)])  # fmt: skip

    sound = [run([3.0, 2.5, 2.1, 1.9]) for _ in range(3)]
    nan_head = [run([3.0, float("nan"), 2.1, 1.9]), *sound[1:]]
    flat_base = [run([2.0, 2.0, 2.0, 2.0]), *sound[1:]]
    assert ab.verdict(ab.health(sound, sound)) == "pass"
    found = ab.health(sound, nan_head)
    assert ab.verdict(found) == "fail" and "head run 1" in found[0].message
    assert found[0].step == 2, found
    assert ab.verdict(ab.health(flat_base, sound)) == "not_judged"
    bare = [Run([{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}])] * 2
    assert ab.judge(bare, bare, 0.05, 0.01) == []


H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


def _h200_rows(slower: float = 1.0, folder: Path = H200) -> str:
    """An H200 golden's own rows (median of its repeats) as a run's metrics.jsonl, each step
    `slower` times as long."""
    (path,) = (folder / "gates" / "gpu-ddp").glob("*.json")
    rows = json.loads(path.read_text())["rows"]
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k != "spread"}
        row["step_time_s"] *= slower
        row["tokens_per_s"] /= slower
        out.append(json.dumps(row) + "\n")
    return "".join(out)


def test_the_h200_gpu_gate_judges_as_it_did_on_the_gpu(tmp_path, capsys):
    """The golden `gate record` wrote on a lent H200 (smoke/gpu-ddp.toml, bf16, 3 repeats
    bitwise identical): its 9.8% step-time spread gives a 29.3% threshold, so an unchanged run is
    not judged (exit 4, as `gate check` said there) and the planted slowdown, +41.9% there, fails
    (exit 1); the curves are exact and pass."""
    (path,) = (H200 / "gates" / "gpu-ddp").glob("*.json")
    g = json.loads(path.read_text())
    assert g["env"]["key_fields"]["device"] == "NVIDIA H200"
    assert all(c["exact"] for c in g["curves"].values())
    assert g["perf"]["step_time_s"]["threshold_rel"] == pytest.approx(0.2926, abs=1e-4)
    same, slow = tmp_path / "same.jsonl", tmp_path / "slow.jsonl"
    same.write_text(_h200_rows())
    slow.write_text(_h200_rows(1.419))
    assert main(["gate", "compare", str(path), str(same)]) == 4
    out = capsys.readouterr().out
    assert "not judged: its threshold 29.3%" in out and "30 steps within exact" in out
    assert main(["gate", "compare", str(path), str(slow)]) == 1
    assert "worse: " in capsys.readouterr().out
    aa = json.loads((H200 / "gate-aa.json").read_text())
    slowed = json.loads((H200 / "gate-slow.json").read_text())
    assert (aa["verdict"], slowed["verdict"]) == ("not_judged", "fail")


def test_the_h200_gpu_bound_gate_catches_what_its_noise_allows(tmp_path, capsys):
    """The GPU-bound golden from a lent H200 (smoke/gpu-ddp-100m.toml's job, 101.8 M
    parameters, 8 repeats bitwise identical): a 4.9% step-time spread, a 14.8% threshold, which
    the gate judges. There an A/A run passed (-0.3%), a planted wait of 10% of a step as CPU
    work failed (+16.0%) and as a sleep passed (+11.0%, inside the noise); the same verdicts
    follow from the golden here."""
    folder = H200 / "gpu-bound"
    (path,) = (folder / "gates" / "gpu-ddp").glob("*.json")
    g = json.loads(path.read_text())
    assert g["repeats"] == 8 and all(c["exact"] for c in g["curves"].values())
    step = g["perf"]["step_time_s"]
    assert step["spread_rel"] == pytest.approx(0.049, abs=1e-3)
    assert step["threshold_rel"] == pytest.approx(0.148, abs=1e-3)  # under 25%: judged
    verdicts = {}
    for name, slower in (("aa", 0.997), ("spin", 1.160), ("sleep", 1.110)):
        run = tmp_path / f"{name}.jsonl"
        run.write_text(_h200_rows(slower, folder))
        verdicts[name] = main(["gate", "compare", str(path), str(run)])
        out = capsys.readouterr().out
        assert "not judged" not in out, out
        stored = json.loads((folder / f"gate-{name}.json").read_text())
        assert stored["verdict"] == ("fail" if name == "spin" else "pass")
    assert verdicts == {"aa": 0, "spin": 1, "sleep": 0}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"param_digest": ["a" * 16] * 4}, "no step changes a parameter"),
        ({"loss": [2.0, 9.0, 4e3, 2.5]}, "the loss explodes while still finite"),
    ],
    ids=["no-update", "exploding-loss"],
)
def test_gate_record_refuses_a_run_that_does_not_train(extra, said):
    """The rules `run_health` holds for the checks refuse a golden too."""
    losses = extra.pop("loss", [2.0, 1.5, 1.2, 1.0])
    with pytest.raises(UsageError, match=f"repeat 1: .*{said}.*fix the job before recording"):
        golden.build([run(losses, **extra)] * 2, HEADER)
