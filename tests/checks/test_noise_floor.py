"""The noise floor (`lockstep.checks.noise_floor`): how far fp32 reordering alone moves a run,
measured on lockstep's reference job in its own ranks, and the per-step rule a difference is
judged by."""

import pytest

from lockstep.checks import noise_floor as nf
from lockstep.checks.divergence_replay import trainer_side
from lockstep.train.config import from_dict
from support.configs import QUIET


@pytest.mark.distributed(world_size=2)
def test_the_floor_is_not_zero_on_the_reference_job(tmp_path):
    """Another intra-op thread count reorders the reference job's sums (a bitwise-identical
    rerun would give a floor of zero, and every difference NOT JUDGED)."""
    cfg = from_dict({"device": "cpu", "steps": 4, "optimizer": {"lr": 1e-2, "warmup_steps": 1},
                     "batch": {"micro_size": 4, "grad_accum": 2}, **QUIET})  # fmt: skip
    side = trainer_side(cfg)
    _, rows = side(4, None, tmp_path / "plain")
    _, again = side(4, None, tmp_path / "again")
    assert nf.measure(rows, [again]).largest() == 0  # the same run is bitwise the same
    with nf.reordered():
        _, reordered = side(4, None, tmp_path / "reordered")
    floor = nf.measure(rows, [reordered])
    assert floor.largest() > 0, floor


def rows(*values):
    return [{"step": s, "loss": v} for s, v in enumerate(values, 1)]


def test_each_step_is_judged_against_the_floor_up_to_it():
    floor = nf.measure(rows(1.0, 1.0, 1.0, 1.0), [rows(1.0, 1.0, 1.0 + 1e-7, 1.0 + 1e-5)])
    # the first visible floor (step 3) stands for steps 1 and 2
    assert floor.at("loss", 1) == floor.at("loss", 3) == pytest.approx(1e-7, rel=1e-3)
    assert floor.at("loss", 4) == pytest.approx(1e-5, rel=1e-3)
    within = nf.judge(rows(1.0, 1.0, 1.0, 1.0), rows(1.0 + 5e-7, 1.0, 1.0, 1.0 + 5e-5), floor)
    assert within.kind == "noise" and "within 10x" in within.text, within
    beyond = nf.judge(rows(1.0, 1.0, 1.0, 1.0), rows(1.0, 1.0 + 2e-6, 1.0, 1.0), floor)
    assert (beyond.kind, beyond.step) == ("beyond", 2), beyond
    assert "20x the floor, beyond 10x" in beyond.text
    zero = nf.judge(
        rows(1.0, 1.0), rows(1.0 + 1e-7, 1.0), nf.measure(rows(1.0, 1.0), [rows(1.0, 1.0)])
    )
    assert zero.kind == "zero" and "noise floor zero" in zero.text
    # within the tolerance asked for: not judged at all
    assert nf.judge(rows(1.0), rows(1.0 + 1e-7), floor, rtol=1e-6).kind == "noise"
