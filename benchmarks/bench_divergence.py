"""The divergence replay's cost (docs/benchmarks.md, "Divergence replay"): a failed determinism
check (an unseeded dropout) with and without its replay, and one training step with and
without the recorder. CPU, gpt2-tiny, one process:

    DS_ACCELERATOR=cpu python benchmarks/bench_divergence.py
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "checks"))

from test_divergence import config

from lockstep.checks import divergence_replay, harness
from lockstep.checks.divergence import Recorder
from lockstep.train import trainer

BUILD = trainer.build_model


def with_dropout(cfg, seed):
    model = BUILD(cfg, seed)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))

    def drop(module, args, out):
        keep = torch.rand(out[0].shape, generator=gen) > 0.1
        return (out[0] * keep / 0.9, *out[1:])

    model.transformer.h[1].attn.register_forward_hook(drop)
    return model


def timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main() -> None:
    cfg = config(steps=4)
    out = Path(tempfile.mkdtemp())
    no_replay = divergence_replay.Findings(None, None, False, [])
    without, with_ = [], []
    with mock.patch.object(trainer, "build_model", with_dropout):
        harness.check_determinism(cfg, out / "warm")
        for i in range(5):
            with mock.patch.object(harness, "investigate", lambda *a, **k: no_replay):
                without.append(timed(lambda i=i: harness.check_determinism(cfg, out / f"a{i}")))
            with_.append(timed(lambda i=i: harness.check_determinism(cfg, out / f"b{i}")))
    print(f"failed determinism check, median s: without replay {statistics.median(without):.3f}, "
          f"with replay {statistics.median(with_):.3f}")  # fmt: skip

    tr = trainer.Trainer(harness.derive(cfg, steps=80), out / "steps")
    for _ in range(2):
        tr.train_step()
    off = timed(lambda: [tr.train_step() for _ in range(20)]) / 20
    rec = Recorder(tr.engine.module, tr.engine.update_optimizer())

    def recorded():
        m = tr.train_step()
        rec.end_step(m.step, m.clip_coef, tr.engine.full_parameters())

    on = timed(lambda: [recorded() for _ in range(20)]) / 20
    rec.close()
    after = timed(lambda: [tr.train_step() for _ in range(20)]) / 20
    tr.close()
    print(f"step: no recorder {off * 1e3:.1f} ms, recording {on * 1e3:.1f} ms, "
          f"recorder removed {after * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
