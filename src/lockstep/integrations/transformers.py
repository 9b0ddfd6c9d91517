"""Hugging Face `Trainer` under `lockstep check --script`.
Manual: docs/scripts.md; design: docs/design/integrations.md."""

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
        """Per-module digests (`track.watch`) for a failed check's replay (docs/forensics.md)."""
        if model is not None:
            track.watch(model)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        stop = self.protocol.max_steps
        if stop and state.global_step >= stop:
            control.should_training_stop = True
            if self.protocol.checkpoint_dir:
                control.should_save = True  # leave a checkpoint where it stops
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
