"""Gates on the reference job, in-process on the plugin's warm ranks (2 gloo ranks, ddp).

One golden is recorded from three runs of the unchanged job; the unchanged job then passes
twice, and each planted change (learning rate, init, data order, a step twice as long, memory
that grows every step) fails with the right metric named. The runs' rows are exactly the rows
`lockstep train` writes to metrics.jsonl; `gate compare` then reads such a file through the CLI.
An alert rule with action "stop" ends a run with a checkpoint.
"""

import json
import time
from dataclasses import asdict

import pytest
import torch

from lockstep.cli import main
from lockstep.gate import golden
from lockstep.gate.compare import compare
from lockstep.gate.run_result import Run
from lockstep.train import checkpoint
from lockstep.train.config import ModelConfig, derive, from_dict
from lockstep.train.data import synthetic_sample
from lockstep.train.model import build_model
from lockstep.train.trainer import run_training
from support.configs import QUIET

pytestmark = pytest.mark.distributed(world_size=2)

SLEEP_PER_SAMPLE_S = 0.25  # one sample per rank a step: a fixed wait, as a GPU-bound step
# waits on its kernels, so that step times hold still on a busy 2-core machine
LEAKED: list[torch.Tensor] = []


class WaitingData:
    """The synthetic stream, each sample costing a fixed wait; `order` permutes it."""

    def __init__(self, seq_len, vocab_size, wait_s=SLEEP_PER_SAMPLE_S, order=None):
        self.seq_len, self.vocab, self.wait_s = seq_len, vocab_size, wait_s
        self.order = order or list(range(4096))

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        time.sleep(self.wait_s)
        return synthetic_sample(1234, self.order[i], self.seq_len, self.vocab)


def waiting_data(seq_len, vocab_size):
    return WaitingData(seq_len, vocab_size)


def slower_data(seq_len, vocab_size):
    """Twice the wait: a step about twice as long (0.26 -> 0.51 s here, +95%). With +40% (+38% a
    step alone) the planted step read only +1.2% over the golden in a heavily loaded run: a
    golden recorded while the machine was busier (each step's own compute, 15 ms alone, grown
    by about 0.1 s) can absorb a smaller slowdown."""
    return WaitingData(seq_len, vocab_size, wait_s=SLEEP_PER_SAMPLE_S * 2)


def shuffled_data(seq_len, vocab_size):
    order = torch.randperm(4096, generator=torch.Generator().manual_seed(7)).tolist()
    return WaitingData(seq_len, vocab_size, order=order)


def leaky_gpt2(cfg):
    """The gpt2-tiny preset with a forward hook that keeps 40 MiB each call."""
    model = build_model(ModelConfig(preset="gpt2-tiny"), 1234)
    model.register_forward_hook(lambda *_: LEAKED.append(torch.ones(10 * 2**20)))
    return model


BASE = {
    "seed": 1234,
    "device": "cpu",
    "steps": 6,
    "optimizer": {"lr": 1e-2, "warmup_steps": 1},
    "batch": {"micro_size": 1, "grad_accum": 1},
    "data": {"factory": f"{__name__}:waiting_data"},
    "checkpoint": {"at_end": False},
    **QUIET,
}


def train(tmp_path, name, **changes):
    result = run_training(derive(from_dict(BASE), **changes), tmp_path / name)
    return Run([asdict(s) for s in result.steps])


def failed(findings):
    return {(f.gate, f.metric) for f in findings if f.failed}


def said(findings):
    return [f"{f.status} {f.gate} {f.metric}: {f.message}" for f in findings]


def test_planted_changes_fail_with_their_metric_and_unchanged_passes(tmp_path, rank):
    runs = [train(tmp_path, f"record-{i}") for i in range(3)]
    g = golden.build(runs, {"name": "reference", "env_key": "test", "machine": "this"})
    assert g.header["curves"]["loss"]["exact"]  # CPU, fixed seeds: the repeats are bitwise equal
    assert g.header["perf"]["step_time_s"]["gated"]
    path = golden.write(g, tmp_path / f"golden-{rank}.json")
    g = golden.read(path)  # what is compared is what was written

    for i in range(2):
        findings = compare(g, train(tmp_path, f"unchanged-{i}"))
        assert not failed(findings), said(findings)

    lr = compare(g, train(tmp_path, "lr", optimizer__lr=2e-2))
    assert {("curve", "lr"), ("curve", "loss")} <= failed(lr), said(lr)

    init = compare(g, train(tmp_path, "init", model__overrides={"initializer_range": 0.03}))
    assert ("curve", "loss") in failed(init) and ("curve", "lr") not in failed(init), said(init)
    first = next(f for f in init if f.metric == "loss")
    assert first.step == 1 and first.value != first.center and first.failing

    order = compare(g, train(tmp_path, "order", data__factory=f"{__name__}:shuffled_data"))
    assert ("curve", "loss") in failed(order) and ("curve", "lr") not in failed(order), said(order)

    slow = compare(g, train(tmp_path, "slow", data__factory=f"{__name__}:slower_data"))
    assert {("perf", "step_time_s"), ("perf", "tokens_per_s")} <= failed(slow), said(slow)
    assert not {m for gate, m in failed(slow) if gate == "curve"}, said(slow)

    try:
        leak = compare(g, train(tmp_path, "leak", model__factory=f"{__name__}:leaky_gpt2"))
    finally:
        LEAKED.clear()
    assert ("perf", "mem_growth_bytes") in failed(leak), said(leak)
    assert not {m for gate, m in failed(leak) if gate == "curve"}, said(leak)  # only memory grew

    if rank == 0:  # `lockstep train` wrote the same rows to metrics.jsonl: compare the file
        assert main(["gate", "compare", str(path), str(tmp_path / "lr" / "metrics.jsonl")]) == 1
        report = tmp_path / "unchanged.json"
        main(
            [
                "gate",
                "compare",
                str(path),
                str(tmp_path / "unchanged-0" / "metrics.jsonl"),
                "--json",
                str(report),
            ]
        )
        curves = [f for f in json.loads(report.read_text())["findings"] if f["gate"] == "curve"]
        assert {f["metric"] for f in curves} >= {"loss", "lr", "grad_norm"}
        assert all(f["status"] == "pass" for f in curves)


def test_alert_with_action_stop_ends_the_run_with_a_checkpoint(tmp_path, rank):
    rule = {
        "name": "loss-high",
        "metric": "loss",
        "when": "above",
        "threshold": 1.0,
        "for_steps": 3,
        "action": "stop",
    }
    cfg = from_dict({**BASE, "data": {}, "alerts": {"rule": [rule]}})
    result = run_training(cfg, tmp_path / "alert")
    assert result.stopped_by == "loss-high"
    assert result.final_step == 3  # fired after 3 steps above, not before
    assert checkpoint.find(tmp_path / "alert" / "checkpoints", "auto").name == "step_00000003"
    if rank == 0:
        lines = [
            json.loads(x)
            for x in (tmp_path / "alert" / "metrics.jsonl").read_text().split("\n")
            if x
        ]
        alerts = [x for x in lines if x.get("event") == "alert"]
        assert [(a["rule"], a["step"], a["since_step"]) for a in alerts] == [("loss-high", 3, 1)]
        assert [x["step"] for x in lines if "event" not in x] == [1, 2, 3]
