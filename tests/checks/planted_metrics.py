"""A black-box script for the checks that logs sound metrics, or the broken ones PLANT names:
`json-nan` (loss `NaN` in the JSON at step 3), `string-nan` (loss `"nan"`, as
`lockstep.track.log` writes a NaN, at step 3), `infinity` (grad_norm `Infinity` at step 3),
`flat` (loss -0.0 at every step: a one-class cross-entropy), `zero-grad` (grad_norm 0 at every
step), `empty-digest` (a model that holds no tensor), `skipped` (step 2's update skipped by
fp16 loss scaling, grad_norm inf there).

It trains nothing, so that a launch costs little: every rank logs the same values (1/step...)
at any world size, `LOCKSTEP_RESUME` restarts after the step written to the checkpoint
folder, and `param_digest` is `lockstep.track.digests` of a small module set from the step.
"""

import json
import os

import torch

from lockstep import track

plant = os.environ.get("PLANT", "")
proto = track.protocol()
rank = int(os.environ.get("RANK", "0"))
saved = proto.checkpoint_dir / "step.txt" if proto.checkpoint_dir else None
start = int(saved.read_text()) if proto.resume and saved and saved.exists() else 0
model = torch.nn.Linear(2, 2)
path = track.metrics_path(rank)
for step in range(start + 1, (proto.max_steps or 6) + 1):
    record = {"step": step, "loss": 1.0 / step, "grad_norm": 0.5 / step, "lr": 0.1}
    if step == 3 and plant in ("json-nan", "string-nan"):
        record["loss"] = float("nan") if plant == "json-nan" else "nan"
    if step == 3 and plant == "infinity":
        record["grad_norm"] = float("inf")  # json.dumps writes Infinity
    if plant == "flat":
        record["loss"] = -0.0
    if plant == "zero-grad":
        record["grad_norm"] = 0.0
    if plant == "skipped" and step == 2:
        record.update(grad_norm=float("inf"), skipped=True)
    with torch.no_grad():
        model.weight.fill_(1.0 / step)
    record.update(track.digests(torch.nn.Module() if plant == "empty-digest" else model))
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
if saved and rank == 0:
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(str(proto.max_steps))
