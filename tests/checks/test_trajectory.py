"""Trajectory comparison: the first diverging step and metric, exact or within tolerance."""

import json

import pytest

from lockstep.checks.trajectory import first_divergence, read_metrics
from lockstep.errors import UsageError

RUN = [{"step": 1, "loss": 2.0, "lr": 0.1}, {"step": 2, "loss": 1.5, "lr": 0.1}]


def test_identical_runs_do_not_diverge():
    assert first_divergence(RUN, [dict(r) for r in RUN]) is None


def test_first_diverging_step_and_metric():
    other = [dict(RUN[0]), {"step": 2, "loss": 1.5, "lr": 0.2}]
    div = first_divergence(RUN, other)
    assert (div.step, div.metric, div.expected, div.actual) == (2, "lr", 0.1, 0.2)


def test_tolerance_and_missing_steps():
    other = [{"step": 1, "loss": 2.0 + 1e-9, "lr": 0.1}]
    assert first_divergence(RUN[:1], other, rtol=1e-6) is None
    assert first_divergence(RUN[:1], other).metric == "loss"
    assert first_divergence(RUN, other, rtol=1e-6).metric == "step"


def test_wall_clock_fields_are_never_compared():
    timed = [dict(r, time=1e9 + r["step"], step_time_s=0.1) for r in RUN]
    other = [dict(r, time=2e9, step_time_s=0.3) for r in RUN]
    assert first_divergence(timed, other) is None
    assert first_divergence(timed, other, metrics=("loss", "time", "step_time_s")) is None


def test_nan_never_matches():
    nan = [{"step": 1, "loss": float("nan")}]
    assert first_divergence(nan, nan) is not None


def test_corrupt_metrics_file_names_the_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n{not json\n")
    with pytest.raises(UsageError, match=r"m.jsonl:2"):
        read_metrics(path)
    with pytest.raises(UsageError, match="no metrics at"):
        read_metrics(tmp_path / "missing.jsonl")
