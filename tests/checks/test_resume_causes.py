"""The resume check's likely causes from the runs' metrics alone (`resume.restart_cause`,
`resume.diagnose_resume`) and the script's own resumability warnings (`resume.resume_warnings`):
the real launches are in test_script_protocol.py, test_script_checks.py and
test_resume_evidence.py."""

from __future__ import annotations

from lockstep.checks.resume import diagnose_resume, restart_cause, resume_warnings
from lockstep.checks.trajectory import first_divergence

STRAIGHT = [{"step": s, "loss": 1.0 / s, "grad_norm": 2.0 / s} for s in range(1, 9)]
# 8 straight steps with an LR and the parameter digest after each update; the first run
# stopped (and saved) at 4, the resumed run logs 5..8
LOGGED = [dict(r, lr=0.1 * r["step"], param_digest=f"p{r['step']}") for r in STRAIGHT]


def test_a_restart_that_loaded_nothing_and_one_that_loaded_the_state():
    fresh = [dict(r) for r in STRAIGHT]
    assert restart_cause(STRAIGHT, fresh, 4, 0.0, 0.0).startswith("no checkpoint was loaded")
    loaded = [dict(r, step=r["step"] - 4) for r in STRAIGHT[4:]]
    assert "the checkpoint of step 4 was loaded" in restart_cause(STRAIGHT, loaded, 4, 0.0, 0.0)
    partly = [dict(r, loss=r["loss"] + 1) for r in loaded]
    cause = restart_cause(STRAIGHT, partly, 4, 0.0, 0.0)
    assert "some state (model or optimizer) was loaded" in cause
    assert "no checkpoint was loaded" not in cause


def diagnose(resumed: list[dict], straight=LOGGED, first_half=None, rtol=0.0) -> str:
    div = first_divergence(straight, resumed, steps=range(5, 9), rtol=rtol)
    assert div is not None
    return diagnose_resume(div, straight, first_half or straight[:4], resumed, rtol, 0.0)


def changed(records: list[dict], step: int, **values) -> list[dict]:
    return [dict(r, **values) if r["step"] == step else dict(r) for r in records]


def without(records: list[dict], field: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != field} for r in records]


def test_equal_inputs_and_lr_with_other_weights_after_the_update_is_the_optimizer():
    # step 5 read the same weights, batch and RNG with the same LR; its update made other
    # weights, so step 6's loss differs: only the optimizer state is left
    resumed = changed(changed(LOGGED[4:], 5, param_digest="x5"), 6, loss=9.0)
    cause = diagnose(resumed)
    assert cause.startswith("the optimizer state was not restored [evidence: ")
    assert "lr agrees at steps 5..8: not the LR schedule" in cause
    assert "step 5, the first after the resume, agrees in loss and grad_norm" in cause
    assert "the weights after step 5's update differ (param_digest)" in cause
    assert "the first run's weights up to step 4 are the straight run's" in cause
    # no LR logged: the schedule moves the update as well, and is named beside it
    assert "the optimizer state was not restored, or the LR schedule" in diagnose(
        without(resumed, "lr"), straight=without(LOGGED, "lr")
    )


def test_a_first_step_that_reads_other_inputs_is_rng_data_or_weights():
    resumed = changed(LOGGED[4:], 5, loss=9.0, param_digest="x5")
    cause = diagnose(resumed)
    assert cause.startswith("the RNG state or data position was not restored (the metrics")
    assert "else the model weights were not loaded" in cause
    assert "step 5, the first after the resume, differs in loss before its update" in cause
    assert "the optimizer state is not judged" in cause and "LR schedule was not" not in cause
    # the LR differs too: both are shown, the schedule first (its lr is read directly)
    both = diagnose(changed(resumed, 5, lr=7.0))
    assert both.startswith("the LR schedule was not restored; and the RNG state or data")
    assert "lr differs at step 5" in both
    unlogged = diagnose(without(resumed, "lr"), straight=without(LOGGED, "lr"))
    assert "the script logs no LR: the LR schedule is not judged" in unlogged


def test_without_a_digest_the_step_where_the_runs_part_ranks_optimizer_and_later_data():
    straight = without(LOGGED, "param_digest")
    at_6 = diagnose(changed(straight[4:], 6, loss=9.0), straight=straight)
    assert at_6.startswith("the optimizer state was not restored, else the data order or RNG")
    assert "no param_digest shows step 5's update (pass model= to track.log)" in at_6
    at_7 = diagnose(changed(straight[4:], 7, loss=9.0), straight=straight)
    assert at_7.startswith("the data order or RNG of a later step")
    assert at_7.index("optimizer state was not restored") > at_7.index("later step")
    # a tolerance: digests are exact, so they are not judged, as if not logged
    near = changed(changed(LOGGED[4:], 5, param_digest="x5"), 6, loss=9.0)
    assert diagnose(near, rtol=1e-9).startswith("the optimizer state was not restored, else")


def test_an_equal_update_clears_the_optimizer_and_leaves_a_later_step():
    cause = diagnose(changed(LOGGED[4:], 7, loss=9.0))
    assert cause.startswith("the data order or RNG of a later step (a new epoch's shuffle)")
    assert "the optimizer state was restored; the runs part at step 7" in cause


def test_a_first_run_that_parts_before_its_checkpoint_is_named_instead():
    # a schedule sized by LOCKSTEP_MAX_STEPS: the first run's LR differs from step 2
    first_half = changed(LOGGED[:4], 2, lr=0.5)
    cause = diagnose(changed(LOGGED[4:], 5, lr=0.0), first_half=first_half)
    assert cause.startswith("the state saved is not the straight run's: the first run parts")
    assert "step 2: lr straight=0.2" in cause and "LOCKSTEP_MAX_STEPS" in cause


def test_resumability_warnings_once_each_scrubbed_and_few(tmp_path):
    site = "/venv/lib/python3.11/site-packages/lightning/pytorch/loops"
    lightning = (
        f"{site}/training_epoch_loop.py:224: You're resuming from a checkpoint that ended "
        "before the epoch ended and your dataloader is not resumable."
    )
    first = tmp_path / "first.log"
    first.write_text("Restoring states from the checkpoint path at /ckpt/last.ckpt\n")
    second = tmp_path / "second.log"
    second.write_text(
        f"[rank0]:{lightning}\n[rank1]:{lightning}\n"
        "loading checkpoint: resuming at step 4\n"  # no warning
        "train.py:30: UserWarning: resuming without the sampler; WANDB_API_KEY=0123456789abcdef\n"
        "There were missing keys in the checkpoint model loaded: ['lm_head.weight'].\n"
        "Didn't find an RNG file, if you are resuming a training that was launched in a "
        "distributed fashion, reproducibility is not guaranteed.\n"
    )
    found = resume_warnings({"a": first, "b": second, "gone": tmp_path / "none.log"})
    assert len(found) == 3, found
    assert found[0] == "run 'b' warned: " + lightning.replace(f"{site}/", "")
    assert found[1].startswith("run 'b' warned: train.py:30: UserWarning: resuming without")
    assert "0123456789abcdef" not in found[1] and "<redacted:" in found[1]
    assert found[2] == (
        "run 'b' warned: There were missing keys in the checkpoint model loaded: "
        "['lm_head.weight']."
    )
