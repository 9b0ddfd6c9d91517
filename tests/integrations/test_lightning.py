"""A real PyTorch Lightning script (examples/train_lightning.py: an MLP with dropout,
`strategy="ddp"` on gloo) through `lockstep check --script`, adopted with `apply_protocol`
only; and a resume flaw planted in a copy of it, each named by the check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.inprocess import run_main
from support.teardown_abort import rerun_once_on_abort

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_lightning.py"
FIT = "trainer.fit(Regressor(), loader, ckpt_path=ckpt_path)"


def check(tmp_path: Path, *args: str, script: Path = SCRIPT, steps: str = "4"):
    """`lockstep check ARGS --script SCRIPT` in this process, its ranks forked (--run-path)
    from a forkserver that imported Lightning (tests/conftest.py); (process, results)."""
    out, runs = tmp_path / "result.json", tmp_path / "runs"
    argv = ["check", *args, "--script", str(script), "--steps", steps, "--out", str(runs),
            "--json", str(out), "--run-path"]  # fmt: skip

    def launch():
        shutil.rmtree(runs, ignore_errors=True)
        out.unlink(missing_ok=True)
        return run_main(argv, tmp_path)

    proc = rerun_once_on_abort(launch, lambda p: p.stdout + p.stderr)
    return proc, json.loads(out.read_text()) if out.exists() else []


def test_lightning_script_passes_every_check(tmp_path):
    proc, results = check(tmp_path, "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_check = {r["check"]: r for r in results}
    assert list(by_check) == ["determinism", "resume", "world-size", "replicas"]
    # resumed mid-epoch (3 steps an epoch) on 2 ranks: every rank's RNG and the sampler's
    # position came back, and Lightning's "not resumable" warning, false here, was not printed
    assert "steps 3..4 after a resume at step 2" in by_check["resume"]["summary"]
    assert "bitwise" in by_check["resume"]["summary"]
    assert not [n for n in by_check["resume"]["notes"] if "warned" in n], by_check["resume"]
    # dropout makes 1 and 2 ranks differ by design: judged with it switched off
    world = by_check["world-size"]
    assert world["passed"] and "dropout in net.2 switched off" in " ".join(world["notes"]), world
    assert "param_digest" in by_check["replicas"]["summary"]
    runs = tmp_path / "runs"
    assert (runs / "resume-checkpoints" / "lockstep-step=2.ckpt").is_file()
    line = json.loads((runs / "determinism-1" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"step", "loss", "grad_norm", "lr", "param_digest", "param_digest_in"} <= set(line)
    # Lightning's logs went to each run's folder, none to the working directory
    assert (runs / "determinism-1" / "lightning_logs").is_dir()
    assert not (tmp_path / "lightning_logs").exists()


FLAWS = {
    # the callback's RNG states left out of the checkpoint: what Lightning saves by itself
    "no-rng": (
        ("from lockstep.integrations.lightning import apply_protocol",
         "from lockstep.integrations import lightning\n"
         "from lockstep.integrations.lightning import apply_protocol\n"
         "lightning.rng_states = lambda: {}\nlightning.set_rng_states = lambda state: None"),
        "the RNG state or data position was not restored",
    ),
    # a sampler without a position: RandomSampler (no DistributedSampler injected) drew the
    # epoch's order as the epoch started; the callback says it cannot set it back
    "no-sampler-position": (
        ("enable_model_summary=False)", "enable_model_summary=False, use_distributed_sampler=False)"),
        "the data position was not restored: the train DataLoader's RandomSampler drew",
    ),
    # the weights loaded by hand, trainer.fit given no ckpt_path: the training state is lost
    "weights-only": (
        (FIT, "model = Regressor()\nif ckpt_path:\n"
              "    model.load_state_dict(torch.load(ckpt_path)['state_dict'])\n"
              "trainer.fit(model, loader)"),
        "the training state was not restored: trainer.fit got no ckpt_path",
    ),
}  # fmt: skip


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_each_resume_flaw_fails_naming_it(tmp_path, flaw):
    (old, new), named = FLAWS[flaw]
    source = SCRIPT.read_text()
    assert source.count(old) == 1, f"the example no longer contains {old!r}"
    script = tmp_path / f"train_{flaw.replace('-', '_')}.py"
    script.write_text(source.replace(old, new))
    # a flaw of the resume does not depend on the world size: one rank is cheaper
    proc, results = check(tmp_path, "resume", "--nproc", "1", script=script, steps="2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    assert not result["passed"] and named in result["diagnosis"], result
    if flaw != "no-rng":  # what the callback said is the cause, not the metrics' guess
        assert "cannot tell them apart" not in result["diagnosis"], result
