"""PyTorch Lightning's `Trainer` under `lockstep check --script`: `apply_protocol` and
`LockstepCallback`. Manual: docs/scripts.md#a-pytorch-lightning-script.

```python
kwargs, ckpt_path = apply_protocol(dict(accelerator="cpu", strategy="ddp", max_steps=1000))
trainer = L.Trainer(**kwargs)
trainer.fit(model, loader, ckpt_path=ckpt_path)
```
"""

from __future__ import annotations

import math
import random
import re
import sys
import warnings
from pathlib import Path

import torch

from lockstep import track

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as missing:
    if missing.name not in ("lightning", "lightning.pytorch"):
        raise
    try:  # the standalone package, where `lightning` is not installed
        import pytorch_lightning as pl
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "lockstep.integrations.lightning needs Lightning, which is not installed: "
            "pip install 'lockstep[lightning]'",
            name="lightning",
        ) from None

CHECKPOINT = "lockstep-step={step}.ckpt"  # in LOCKSTEP_CHECKPOINT_DIR
KEY = "lockstep"  # the checkpoint's entry for what Lightning leaves out
CANNOT = "lockstep: warning: resuming inexactly: "  # a line per part not restored (checks.resume)
# Lightning's, false where the callback positions the loader itself
LIGHTNING_NOT_RESUMABLE = "You're resuming from a checkpoint that ended before the epoch ended"


def latest_checkpoint(folder: Path | None) -> str | None:
    """The checkpoint of the highest step `LockstepCallback` saved in `folder`, or None."""
    if folder is None or not folder.is_dir():
        return None
    saved = {}
    for path in folder.glob(CHECKPOINT.format(step="*")):
        if found := re.fullmatch(re.escape(CHECKPOINT).replace(r"\{step\}", r"(\d+)"), path.name):
            saved[int(found[1])] = path
    return str(saved[max(saved)]) if saved else None


def apply_protocol(kwargs: dict, protocol: track.Protocol | None = None):
    """`(trainer_kwargs, ckpt_path)` for the current protocol; outside a check only
    `LockstepCallback` is added."""
    proto = protocol or track.protocol()
    kwargs = dict(kwargs)
    callbacks = kwargs.get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, pl.Callback) else list(callbacks)
    if not any(isinstance(c, LockstepCallback) for c in callbacks):
        callbacks.append(LockstepCallback(protocol=proto))
    kwargs["callbacks"] = callbacks
    # only raised: a schedule sized by `trainer.estimated_stepping_batches` reads it
    ends = kwargs.get("max_steps")
    if proto.max_steps and ends is not None and 0 <= ends < proto.max_steps:
        kwargs["max_steps"] = proto.max_steps
    if proto.metrics:  # lightning_logs/ and the default ModelCheckpoint's files
        kwargs["default_root_dir"] = str(proto.metrics.parent)
    if track.replay_dtype() == "float64":
        kwargs["precision"] = "64-true"
    ckpt = latest_checkpoint(proto.checkpoint_dir) if proto.resume else None
    return kwargs, ckpt


def _world():
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _bytes(state) -> bytes:
    return state.numpy().tobytes()


def _tensor(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def rng_states() -> dict:
    """This process's RNG states as bytes and tuples (`all_gather_object` and a weights_only
    load take them)."""
    state = {"torch": _bytes(torch.get_rng_state()), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    if (np := sys.modules.get("numpy")) is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (kind, keys.tobytes(), pos, has_gauss, gauss)
    return state


def set_rng_states(state: dict) -> None:
    """Set back what `rng_states` returned."""
    torch.set_rng_state(_tensor(state["torch"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(s) for s in state["cuda"]])
    if "numpy" in state and (np := sys.modules.get("numpy")) is not None:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.frombuffer(keys, dtype=np.uint32), pos, has_gauss, gauss))


def every_rank(value) -> list:
    """`value` of every rank, in rank order (a collective where there are several)."""
    if _world() == 1:
        return [value]
    out = [None] * _world()
    torch.distributed.all_gather_object(out, value)
    return out


# samplers that draw the epoch's order from an RNG as it starts, before any checkpoint
DRAWN = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")


class _Skip(torch.utils.data.Sampler):
    """`sampler` without its first `n` indices, the first time it is iterated; then itself."""

    def __init__(self, sampler, n: int):
        self.sampler, self.n = sampler, n

    def __iter__(self):
        n, self.n = self.n, 0
        it = iter(self.sampler)
        for _ in range(n):
            next(it, None)
        return it

    def __len__(self):
        return len(self.sampler)

    def __getattr__(self, name):  # set_epoch and the like
        if name in ("sampler", "n"):  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.sampler, name)


def position(loader, batches: int) -> str | None:
    """Make `loader` skip the `batches` it already gave this epoch; None, or why it cannot."""
    if batches <= 0 or (hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")):
        return None  # a stateful loader: Lightning sets it back itself
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    name = type(loader).__name__
    if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        return (f"the data position was not restored: the train {name} reads an "
                "IterableDataset without state_dict/load_state_dict, from the epoch's start")  # fmt: skip
    if not isinstance(batch_sampler, torch.utils.data.BatchSampler) or sampler is None:
        return (f"the data position was not restored: the train {name}'s batch sampler "
                f"({type(batch_sampler).__name__}) has no sampler to skip {batches} batches of")  # fmt: skip
    inner = getattr(getattr(sampler, "dataset", None), "_sampler", sampler)  # Lightning's wrapper
    if type(inner).__name__ in DRAWN:
        return (f"the data position was not restored: the train {name}'s {type(inner).__name__} "
                "drew this epoch's order from the RNG as the epoch started, before the "
                "checkpoint (a DistributedSampler, which Trainer(strategy='ddp') injects, orders "
                "by seed and epoch)")  # fmt: skip
    if batches < len(batch_sampler):
        batch_sampler.sampler = _Skip(sampler, batches * batch_sampler.batch_size)
    return None


class LockstepCallback(pl.Callback):
    """Logs each optimizer step and stops and saves at LOCKSTEP_MAX_STEPS; every checkpoint
    holds each rank's RNG states and the data position, which a resume sets back."""

    def __init__(self, digest: bool = True, protocol: track.Protocol | None = None):
        self.digest = digest
        self.protocol = protocol or track.protocol()
        self._losses: list = []  # the current optimizer step's, one per micro-batch
        self._grad_norm = self._lr = None
        self._logged = 0
        self._loaded: dict | None = None  # the checkpoint's `KEY`, until training starts

    # ------------------------------------------------------------------ each step

    def on_fit_start(self, trainer, pl_module):
        track.watch(pl_module)  # per-module digests, in a failed check's replay only

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.protocol.metrics and self._grad_norm is None:  # the first optimizer's
            grads = [p.grad.detach() for p in pl_module.parameters() if p.grad is not None]
            norms = [torch.linalg.vector_norm(g) for g in grads]
            self._grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else None
            self._lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):  # divided by the accumulation already: summed
            self._losses.append(loss.detach())
        step = trainer.global_step
        if step <= self._logged:  # a micro-batch that did not step
            return
        self._logged = step
        if self.protocol.metrics and self._losses:
            self._log(trainer, pl_module, step)
        self._losses, self._grad_norm, self._lr = [], None, None
        stop = self.protocol.max_steps
        if stop and step >= stop:
            if self.protocol.checkpoint_dir:  # the protocol: leave a checkpoint where it stops
                trainer.save_checkpoint(self.protocol.checkpoint_dir / CHECKPOINT.format(step=step))
            trainer.should_stop = True

    def _log(self, trainer, pl_module, step: int) -> None:
        loss = trainer.strategy.reduce(torch.stack(self._losses).sum(), reduce_op="mean")
        metrics = {"loss": loss}
        if self._grad_norm is not None:
            metrics["grad_norm"] = self._grad_norm
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            if scaler is not None and not math.isfinite(float(self._grad_norm)):
                metrics["skipped"] = True  # fp16: the scaler skips a step with inf gradients
        if self._lr is not None:
            metrics["lr"] = self._lr
        track.log(step, model=pl_module if self.digest else None, **metrics)

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        """Every rank saves (`trainer.save_checkpoint` calls this on each): a collective."""
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        checkpoint[KEY] = {"rng": every_rank(rng_states()), "epoch": trainer.current_epoch,
                           "batches": batches}  # fmt: skip

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self._loaded = checkpoint.get(KEY, {})

    def on_train_start(self, trainer, pl_module):
        """A resume: data position, then RNG. The last hook before the first batch (no
        `on_train_epoch_start` for an epoch resumed in the middle)."""
        saved, self._loaded = self._loaded, None
        wanted = latest_checkpoint(self.protocol.checkpoint_dir) if self.protocol.resume else None
        if wanted and not trainer.ckpt_path:
            self._cannot(trainer, [
                "the training state was not restored: trainer.fit got no ckpt_path though "
                f"LOCKSTEP_RESUME=1 and {Path(wanted).name} is there, so only what the script "
                "loaded itself is (not the optimizer, LR schedulers, step counter, loops, RNG "
                "or data position)"
            ])  # fmt: skip
        if saved is None:
            return
        if not saved:
            return self._cannot(trainer, ["the RNG states and data position were not restored: "
                                          "the checkpoint holds none (saved without "
                                          "LockstepCallback)"])  # fmt: skip
        why, loaders = [], _train_loaders(trainer)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        epoch = trainer.fit_loop.epoch_progress.current.processed
        for loader in loaders:  # as Lightning will, before the iterator below reads it
            _set_epoch(loader, epoch)
        within = saved["epoch"] == epoch  # else the checkpoint ended its epoch
        if within:
            why += [w for dl in loaders if (w := position(dl, saved["batches"])) is not None]
            if not why:  # every loader is positioned: Lightning's warning would be false
                warnings.filterwarnings("ignore", message=LIGHTNING_NOT_RESUMABLE)
            if fetcher is not None and any(getattr(dl, "num_workers", 0) for dl in loaders):
                iter(fetcher)  # workers took their first indices before the skip: again
        if len(saved["rng"]) == _world():
            set_rng_states(saved["rng"][trainer.global_rank])
        else:
            why.append(f"the RNG states were not restored: saved by {len(saved['rng'])} ranks, "
                       f"resumed on {_world()}")  # fmt: skip
        if not within and fetcher is not None:  # the new epoch's iterator draws from that RNG
            iter(fetcher)
        self._cannot(trainer, why)

    @staticmethod
    def _cannot(trainer, why: list[str]) -> None:
        if trainer.is_global_zero:
            for line in why:
                print(CANNOT + line, file=sys.stderr, flush=True)


def _set_epoch(loader, epoch: int) -> None:
    """`set_epoch` of the loader's samplers, as Lightning calls it when an epoch starts."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    samplers = (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    for sampler in {id(s): s for s in samplers}.values():  # samplers may be unhashable
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)


def _train_loaders(trainer) -> list:
    """The train dataloaders (`trainer.train_dataloader`: one, or a collection of them)."""
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
