"""Per-module digests (`lockstep.module_digest`): a recorder on a model names each module's
output, each gradient and each parameter, and a step's record survives its JSON line (what
`lockstep.track.watch` writes for a script's replay)."""

import json

import torch
from torch import nn

from lockstep.module_digest import PASSES, Recorder, StepRecord, digest


def test_recorder_names_outputs_gradients_and_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = Recorder(model, optimizer)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    recorder.end_step(1, 1.0, dict(model.named_parameters()))
    recorder.close()
    (record,) = recorder.records
    assert [n for n, _ in record.forward] == ["0#0", "1#0", "2#0", "(model)#0"]
    assert [n for n, _ in record.backward][:2] == ["2.weight", "2.bias"]  # backward order
    assert [n for n, _ in record.update] == sorted(n for n, _ in model.named_parameters())
    assert dict(record.update)["0.weight"] == digest(model[0].weight)


def test_a_step_record_round_trips_through_json():
    x = torch.arange(6.0).reshape(2, 3)
    record = StepRecord(3, [("a#0", digest(x))], [("w", digest(-x))], [("w", digest(x * 2))])
    line = json.dumps(record.to_json())
    assert list(json.loads(line)) == ["step", *PASSES]
    assert StepRecord.from_json(json.loads(line)) == record
    assert digest(x).sha != digest(x + 1e-6).sha and digest(x) == digest(x.clone())
