"""`lockstep check resume --script` names the causes the logged metrics show and quotes the
script's own resumability warnings, on resumes of examples/train_protocol.py that forget
state (the RNG-only and data-position-only ones: test_script_checks.py).

One rank, 4 steps (a resume at step 2), ranks forked (--run-path): three launches a case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.script_check import check, planted

LOADS = (
    '    opt.load_state_dict(state["opt"])\n'
    '    sched.load_state_dict(state["sched"])\n'
    '    torch.set_rng_state(state["rng"])\n'
    '    step, position = state["step"], state["position"]\n'
)
SITE = "/venv/lib/python3.11/site-packages/lightning/pytorch/loops"
LIGHTNING = (  # lightning/pytorch/loops/training_epoch_loop.py, as the warnings module prints it
    f"{SITE}/training_epoch_loop.py:224: PossibleUserWarning: You're resuming from a "
    "checkpoint that ended before the epoch ended and your dataloader is not resumable. This "
    "can cause unreliable results if further training is done."
)
VARIANTS = {
    # all but the weights
    "no-weights": ('    model.load_state_dict(state["model"])\n', ""),
    # only the weights: a new optimizer and schedule, the RNG and data from the start
    "weights-only": (LOADS, '    step = state["step"]\n'),
    # all but the optimizer's state (its lr too: LambdaLR's state does not hold it)
    "optimizer": ('    opt.load_state_dict(state["opt"])\n', ""),
    # the data position lost, and a resumed run that warns on stderr as Lightning does, with
    # a line of the script's own holding a secret, and an info line that is no warning
    "warns": (
        'step, position = state["step"], state["position"]\n',
        'step = state["step"]\n'
        "    import sys\n"
        f"    print({LIGHTNING!r}, file=sys.stderr)\n"
        "    print('train.py:9: UserWarning: resuming; WANDB_API_KEY=0123456789abcdef0123',"
        " file=sys.stderr)\n"
        "    print('Restoring states from the checkpoint path at /ckpt/state.pt')\n",
    ),
}


def variant(tmp_path: Path, name: str) -> str:
    return str(planted(tmp_path, name, [VARIANTS[name]]))


@pytest.mark.parametrize(
    ("name", "causes", "evidence"),
    [
        # the schedule is read directly; the first step's loss shows the batch or RNG, the
        # optimizer cannot be judged past both
        (
            "weights-only",
            "the LR schedule was not restored; and the RNG state or data position was not "
            "restored (the metrics cannot tell them apart) [evidence: ",
            [
                "the first run's weights up to step 2 are the straight run's",
                "lr differs at step 3",
                "step 3, the first after the resume, differs in loss before its update: its "
                "weights are the straight run's (param_digest_in), so its batch or RNG",
                "the optimizer state is not judged",
            ],
        ),
        # everything restored but the weights: the weights step 3 entered with show it
        (
            "no-weights",
            "the model weights were not restored [evidence: ",
            [
                "step 3 entered its forward with other weights than the straight run's after "
                "step 2 (param_digest_in)"
            ],
        ),
        # step 3 read the same weights, batch and RNG with the same logged LR; the weights
        # after its update differ
        (
            "optimizer",
            "the optimizer state was not restored [evidence: ",
            [
                "lr agrees at steps 3..4: not the LR schedule",
                "step 3, the first after the resume, agrees in loss and grad_norm",
                "the weights after step 3's update differ (param_digest)",
            ],
        ),
        (
            "warns",
            "the RNG state or data position was not restored (the metrics cannot tell them "
            "apart) [evidence: ",
            ["lr agrees at steps 3..4: not the LR schedule", "differs in loss before its update"],
        ),
    ],
)
def test_resume_names_the_causes_the_metrics_show(tmp_path, name, causes, evidence):
    script = variant(tmp_path, name)
    proc, results = check("resume", "--script", script, "--nproc", "1", "--run-path", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    assert result["diagnosis"].startswith(causes), result["diagnosis"]
    for line in evidence:
        assert line in result["diagnosis"], (line, result["diagnosis"])
    assert f"likely cause: {causes}" in proc.stdout
    warned = [n for n in result["notes"] if " warned: " in n]
    if name != "warns":
        assert not warned, warned
        return
    # one line each, the warning's folders left out, the secret redacted, no info line
    lightning = LIGHTNING.replace(f"{SITE}/", "")
    assert warned[0] == f"run 'resume-second-half' warned: {lightning}", warned
    assert warned[1].startswith("run 'resume-second-half' warned: train.py:9: UserWarning: ")
    assert "<redacted:" in warned[1] and len(warned) == 2, warned
    assert "0123456789abcdef0123" not in proc.stdout + str(results)
    assert f"note: {warned[0]}" in proc.stdout.splitlines()
