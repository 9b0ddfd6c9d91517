"""`lockstep.run_health` on constructed records: the encodings of NaN and inf, a metric not
logged, a flat loss, zero gradients, an empty digest, a skipped fp16 step; and the gate on a
sparse metric (logged every other step), which is "not logged" in between, never NaN."""

import json

import pytest

from lockstep import run_health
from lockstep.gate import golden
from lockstep.gate.compare import compare
from lockstep.gate.run_result import Run
from lockstep.track import EMPTY_DIGEST

LOSSES = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]


def rows(**changes) -> list[dict]:
    """Six sound steps; `changes` {field: {step: value}}."""
    out = [{"step": i, "loss": x, "grad_norm": x / 2, "lr": 0.1} for i, x in enumerate(LOSSES, 1)]
    for field, at in changes.items():
        for step, value in at.items():
            out[step - 1][field] = value
    return out


@pytest.mark.parametrize(
    "text", ['{"v": NaN}', '{"v": "nan"}', '{"v": Infinity}', '{"v": "-inf"}', '{"v": "Infinity"}']
)
def test_every_encoding_of_nan_and_inf_is_non_finite(text):
    assert run_health.is_non_finite(json.loads(text)["v"])


@pytest.mark.parametrize("value", [None, 1.5, 0, "e3b0c44298fc1c14", "12345e6789012345", True])
def test_numbers_text_and_not_logged_are_not_non_finite(value):
    """A digest of digits and one 'e' reads as inf through float(): it is text here."""
    assert not run_health.is_non_finite(value)


def test_a_sound_run_and_a_sparse_metric_pass():
    sparse = rows()
    for record in sparse[1::2]:
        del record["grad_norm"]
    assert run_health.problem(rows(), ("loss", "grad_norm", "lr")) is None
    assert run_health.problem(sparse, ("loss", "grad_norm", "lr")) is None


def test_the_first_step_and_metric_holding_nan_are_named():
    found = run_health.problem(rows(grad_norm={3: "inf"}, loss={4: float("nan")}), ("loss",))
    assert (found.kind, found.step, found.metric, found.value) == ("non-finite", 4, "loss", "nan")
    found = run_health.problem(rows(grad_norm={3: "inf"}, loss={4: "nan"}), ("loss", "grad_norm"))
    assert (found.step, found.metric, found.value) == (3, "grad_norm", "inf")


def test_a_skipped_step_excuses_its_grad_norm_only():
    skipped = rows(grad_norm={2: "inf"}, skipped={2: True})
    assert run_health.problem(skipped, ("loss", "grad_norm")) is None
    assert run_health.skipped_notes(skipped) == [
        "step 2: grad_norm not finite on a step the optimizer skipped (fp16 loss scaling): "
        "not a failure"
    ]
    nan_loss = rows(loss={2: "nan"}, skipped={2: True})
    assert run_health.problem(nan_loss, ("loss", "grad_norm")).metric == "loss"


def test_a_flat_loss_takes_three_consecutive_identical_steps():
    two = rows(loss={2: 1.5, 3: 1.5})
    three = rows(loss={2: 1.5, 3: 1.5, 4: 1.5})
    signed = rows(loss={2: 0.0, 3: -0.0, 4: 0.0})  # bitwise: -0.0 is not 0.0
    assert run_health.flat_loss(two) is None and run_health.flat_loss(signed) is None
    assert run_health.flat_loss(three).text.startswith("loss is 1.5 at each of steps 2..4")


def test_parameters_that_never_change_do_not_train_but_a_skipped_step_may_keep_them():
    frozen = [dict(r, param_digest="a" * 16) for r in rows()]
    found = run_health.not_training(frozen)
    assert (found.kind, found.step, found.metric) == ("no update", 1, "param_digest")
    assert "after each of steps 1..6 (6 logged steps)" in found.text
    moving = [dict(r, param_digest=f"{i:016x}") for i, r in enumerate(rows())]
    assert run_health.not_training(moving) is None
    # fp16 loss scaling skipped step 2: its digest repeats step 1's, and that is no failure
    skipped = [dict(r, param_digest="b" * 16) for r in rows()[:2]]
    skipped[1]["skipped"] = True
    assert run_health.no_update(skipped) is None
    assert run_health.no_update(frozen[:1]) is None  # one step: nothing to compare
    # no digest: not judged, and said so
    assert run_health.no_update(rows()) is None
    assert "cannot be judged" in run_health.update_notes(rows())[0]
    assert run_health.update_notes(moving) == []


def test_a_loss_that_explodes_while_finite_fails_and_spikes_do_not():
    spikes = rows(loss={3: 40.0, 5: 150.0})  # a 75x spike: noisy, not an explosion
    assert run_health.exploding_loss(spikes) is None
    found = run_health.not_training(rows(loss={4: 5e14}))
    assert (found.kind, found.step, found.value) == ("exploding loss", 4, "500000000000000.0")
    # a first loss at or near 0 sets no scale: LOSS_FLOOR does
    near_zero = rows(loss={1: 1e-9, 2: 0.5, 3: 600.0})
    assert run_health.exploding_loss(near_zero) is None
    assert run_health.exploding_loss(rows(loss={1: 0.0, 4: 1001.0})).step == 4


def test_zero_gradients_and_an_empty_digest_do_not_train():
    zero = [dict(r, grad_norm=0.0) for r in rows()]
    assert run_health.zero_gradients(zero).kind == "zero gradients"
    assert run_health.zero_gradients(rows(grad_norm={1: 0.0})) is None  # one step: it trains
    empty = [dict(r, param_digest=EMPTY_DIGEST) for r in rows()]
    assert run_health.not_training(empty).kind == "empty digest"


def test_the_gate_compares_a_sparse_metric_where_logged():
    """eval_loss every other step: the golden records it there, the run passes; a run that
    stops logging it fails as "not logged", never as NaN or better."""

    def run(logged: bool = True) -> Run:
        return Run([dict(r, eval_loss=r["loss"] + 0.1) if logged and r["step"] % 2 else r
                    for r in rows()])  # fmt: skip

    g = golden.build([run(), run()], {"name": "sparse", "env_key": "k", "machine": "m"})
    assert g.header["curves"]["eval_loss"]["exact"]
    assert not [f for f in compare(g, run()) if f.failed]
    (missing,) = [f for f in compare(g, run(logged=False)) if f.failed]
    assert missing.metric == "eval_loss" and "eval_loss not logged" in missing.message
    assert "better" not in missing.message
