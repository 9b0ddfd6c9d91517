"""The resume check's likely causes from the runs' metrics alone (`resume.restart_cause`): a
resumed run that starts again at step 1 loaded nothing only when its steps are the straight
run's from step 1; the real launches are in test_script_protocol.py."""

from __future__ import annotations

from lockstep.checks.resume import restart_cause

STRAIGHT = [{"step": s, "loss": 1.0 / s, "grad_norm": 2.0 / s} for s in range(1, 9)]


def test_a_restart_that_loaded_nothing_and_one_that_loaded_the_state():
    fresh = [dict(r) for r in STRAIGHT]
    assert restart_cause(STRAIGHT, fresh, 4, 0.0, 0.0).startswith("no checkpoint was loaded")
    loaded = [dict(r, step=r["step"] - 4) for r in STRAIGHT[4:]]
    assert "the checkpoint of step 4 was loaded" in restart_cause(STRAIGHT, loaded, 4, 0.0, 0.0)
    partly = [dict(r, loss=r["loss"] + 1) for r in loaded]
    cause = restart_cause(STRAIGHT, partly, 4, 0.0, 0.0)
    assert "some state (model or optimizer) was loaded" in cause
    assert "no checkpoint was loaded" not in cause
