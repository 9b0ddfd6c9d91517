"""`lockstep check --script` on runs that must never pass (issue 35): NaN and inf however the
script wrote them, a flat loss, zero gradients, a digest of nothing; and what must not fail:
an fp16 step the optimizer skipped with an inf gradient norm, and FSDP2's sharded parameters,
whose digest now covers them.

tests/checks/planted_metrics.py plants each (PLANT): it trains nothing, so a launch is cheap;
each plant is one launch of the replicas check (every rank writes) unless it says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lockstep.track import EMPTY_DIGEST
from support.script_check import check

PLANTED = str(Path(__file__).with_name("planted_metrics.py"))


def planted(tmp_path, monkeypatch, plant: str, *args: str):
    monkeypatch.setenv("PLANT", plant)
    return check(*args, "--script", PLANTED, "--run-path", cwd=tmp_path)


def test_a_nan_written_by_track_fails_every_check(tmp_path, monkeypatch):
    """The string "nan" (what `track.log` writes for a NaN): every check passed on it."""
    proc, results = planted(tmp_path, monkeypatch, "string-nan", "all")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [r["check"] for r in results] == ["determinism", "resume", "world-size", "replicas"]
    for result in results:
        assert result["verdict"] == "fail"
        assert result["problem"] == {"kind": "non-finite", "step": 3, "metric": "loss",
                                     "value": "nan"}  # fmt: skip
        assert "loss is nan at step 3 (not a finite number)" in result["summary"]


@pytest.mark.parametrize(
    ("plant", "metric", "value"), [("json-nan", "loss", "nan"), ("infinity", "grad_norm", "inf")]
)
def test_json_nan_and_infinity_fail(tmp_path, monkeypatch, plant, metric, value):
    proc, (result,) = planted(tmp_path, monkeypatch, plant, "replicas")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert result["problem"] == {"kind": "non-finite", "step": 3, "metric": metric, "value": value}
    assert f"{metric} is {value} at step 3 (not a finite number)" in result["summary"]


@pytest.mark.parametrize(
    ("plant", "words"),
    [
        ("flat", "loss is -0.0 at each of steps 1..4 (4 logged steps, bitwise identical): "
                 "the run does not train"),
        ("zero-grad", "grad_norm is 0 at every one of the 4 logged steps"),
        ("empty-digest", f"the parameter digest of step 1 covered no tensor ({EMPTY_DIGEST}"),
    ],
)  # fmt: skip
def test_a_run_that_does_not_train_fails(tmp_path, monkeypatch, plant, words):
    proc, (result,) = planted(tmp_path, monkeypatch, plant, "replicas")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert result["verdict"] == "fail" and words in result["summary"], result["summary"]
    assert "FAIL replicas" in proc.stdout


def test_an_inf_gradient_norm_on_a_skipped_step_is_noted(tmp_path, monkeypatch):
    """fp16 loss scaling: step 2's update skipped (`skipped: true`), its grad norm inf in both
    runs; the runs agree, and the step is named in a note."""
    proc, (result,) = planted(tmp_path, monkeypatch, "skipped", "determinism", "--nproc", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["verdict"] == "pass"
    assert any("step 2: grad_norm not finite on a step the optimizer skipped" in n
               for n in result["notes"]), result["notes"]  # fmt: skip


FSDP2 = """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from lockstep import track

proto = track.protocol()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
for step in range(1, proto.max_steps + 1):
    x = data[16 * (step - 1) : 16 * step][rank::2]
    loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    dist.all_reduce(loss := loss.detach())
    track.log(step, loss=loss / 2, model=model)
track.finish()
"""


def test_fsdp2_parameters_are_digested(tmp_path):
    """FSDP2 holds DTensor parameters: the digest covered none of them (the digest of
    nothing, on every rank alike); now their full value, gathered on every rank."""
    script = tmp_path / "fsdp2.py"
    script.write_text(FSDP2)
    proc, (result,) = check("replicas", "--script", str(script), "--run-path", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "param_digest" in result["summary"]
    for rank in (0, 1):
        (metrics,) = (tmp_path / "runs" / "replicas").glob(f"metrics-{rank}.jsonl")
        digests = {json.loads(line)["param_digest"] for line in metrics.read_text().splitlines()}
        assert EMPTY_DIGEST not in digests and len(digests) == 4  # one per step: it trains
