"""A real Hugging Face `Trainer` script (examples/train_hf_trainer.py: a tiny random GPT-2 from
a transformers config, lockstep's synthetic data) through `lockstep check all --script` on 2
gloo ranks, adopted with `apply_protocol` and `LockstepCallback` only."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from support.inprocess import run_main
from support.teardown_abort import rerun_once_on_abort

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_hf_trainer.py"


def test_trainer_script_passes_every_check(tmp_path):
    out, runs = tmp_path / "result.json", tmp_path / "runs"
    # --run-path: ranks forked from a process that imported torch and transformers' Trainer
    # once (tests/conftest.py), not 11 new interpreters importing them
    argv = ["check", "all", "--script", str(SCRIPT), "--steps", "4", "--out", str(runs),
            "--json", str(out), "--run-path"]  # fmt: skip

    def launch():
        shutil.rmtree(runs, ignore_errors=True)
        return run_main(argv, tmp_path)

    start = time.perf_counter()
    proc = rerun_once_on_abort(launch, lambda p: p.stdout + p.stderr)
    print(f"lockstep check all --script train_hf_trainer.py: {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert [r["check"] for r in results] == ["determinism", "resume", "world-size", "replicas"]
    assert "bitwise" in results[1]["summary"]  # Trainer's own resume is exact on CPU
    assert "param_digest" in results[3]["summary"]
    # the callback saved where the protocol stopped the run, whatever save_strategy says
    assert (runs / "resume-checkpoints" / "checkpoint-2").is_dir()
    line = json.loads((runs / "determinism-1" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"step", "loss", "grad_norm", "lr", "time", "param_digest"} <= set(line)
