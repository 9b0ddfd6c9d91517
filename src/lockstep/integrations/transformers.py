"""Hugging Face `Trainer` under `lockstep check --script`: two lines in the script.

```python
from lockstep.integrations.transformers import LockstepCallback, apply_protocol

args, resume = apply_protocol(TrainingArguments(output_dir="out", max_steps=1000, ...))
trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[LockstepCallback()])
trainer.train(resume_from_checkpoint=resume)
```

`apply_protocol` maps the protocol onto `TrainingArguments`: `output_dir` from
LOCKSTEP_CHECKPOINT_DIR, a log line every optimizer step
(`logging_steps=1`), and, with LOCKSTEP_RESUME=1, the latest `checkpoint-N` folder there as
`resume_from_checkpoint`. Outside a check (no LOCKSTEP_* variables) it changes nothing and
returns `resume=None`. LOCKSTEP_MAX_STEPS is where the run *stops*, not the length of the
training: `max_steps` (which sets the LR schedule's length) stays the script's own and is only
raised to LOCKSTEP_MAX_STEPS when smaller; the callback stops the run there. (Setting
`max_steps = LOCKSTEP_MAX_STEPS` would give the first half of the resume check a schedule
that ends at N, and its checkpoint an LR of 0: the resume check then fails, rightly, since a
real job resumed with a longer `max_steps` does the same.) `LockstepCallback` writes loss (Trainer's mean over ranks), grad norm
and learning rate of every optimizer step through `lockstep.track.log`, with the model's
parameter digest (the replicas check), and asks Trainer to save a checkpoint at the last
step, so a run that stops at LOCKSTEP_MAX_STEPS leaves one whatever `save_steps` says.
"""

from __future__ import annotations

from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from lockstep import track


def apply_protocol(args, protocol: track.Protocol | None = None):
    """`(args, resume_from_checkpoint)` for the current protocol; `args` changed in place."""
    proto = protocol or track.protocol()
    if proto.max_steps and args.max_steps < proto.max_steps:
        args.max_steps = proto.max_steps  # also replaces an epoch-based length (-1)
    if proto.checkpoint_dir:
        args.output_dir = str(proto.checkpoint_dir)
    if proto.metrics:
        args.logging_steps = 1
        args.logging_strategy = "steps"
    resume = None
    if proto.resume and proto.checkpoint_dir and proto.checkpoint_dir.is_dir():
        resume = get_last_checkpoint(str(proto.checkpoint_dir))
    return args, resume


class LockstepCallback(TrainerCallback):
    """Logs each optimizer step through `lockstep.track` and saves at the protocol's stop."""

    def __init__(self, digest: bool = True):
        self.digest = digest
        self.protocol = track.protocol()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """A failed check's replay only (docs/forensics.md): per-module digests
        (`track.watch`). The float64 replay needs the model built or cast before the
        Trainer (`track.replay_dtype()`): DDP has wrapped it by now."""
        if model is not None:
            track.watch(model)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        stop = self.protocol.max_steps
        if stop and state.global_step >= stop:
            control.should_training_stop = True
            if self.protocol.checkpoint_dir:
                control.should_save = True  # the protocol: leave a checkpoint where it stops
        return control

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs:  # evaluation and the end-of-training summary
            return control
        metrics = {"loss": logs["loss"]}
        if logs.get("grad_norm") is not None:
            metrics["grad_norm"] = logs["grad_norm"]
        if logs.get("learning_rate") is not None:
            metrics["lr"] = logs["learning_rate"]
        track.log(state.global_step, model=model if self.digest else None, **metrics)
        return control
