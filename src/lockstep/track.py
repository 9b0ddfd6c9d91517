"""The black-box protocol's side in a training script (`protocol`, `log`, `finish`), and `read`
for what `log` writes. Design: docs/design/protocol.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from lockstep import state_digest
from lockstep.state_digest import EMPTY_DIGEST, digests  # noqa: F401 (the protocol's API)

RANK_PLACEHOLDER = "{rank}"
# a script's command-line placeholders: `Protocol`'s fields, in order
PLACEHOLDERS = ("metrics", "max_steps", "checkpoint_dir", "resume")


@dataclass(frozen=True)
class Protocol:
    """The protocol's variables (`protocol()` reads them)."""

    metrics: Path | None
    max_steps: int | None
    checkpoint_dir: Path | None
    resume: bool

    def values(self) -> dict[str, str]:
        """Each placeholder's text; an unset one is empty."""
        return {
            "metrics": "" if self.metrics is None else str(self.metrics),
            "max_steps": "" if self.max_steps is None else str(self.max_steps),
            "checkpoint_dir": "" if self.checkpoint_dir is None else str(self.checkpoint_dir),
            "resume": "1" if self.resume else "0",
        }

    def environ(self) -> dict[str, str]:
        """The LOCKSTEP_* variables `protocol()` reads back as this."""
        return {f"LOCKSTEP_{name.upper()}": text for name, text in self.values().items()}

    def metrics_of(self, rank: int) -> Path | None:
        """The file `rank` writes."""
        if self.metrics is None:
            return None
        return Path(str(self.metrics).replace(RANK_PLACEHOLDER, str(rank)))


REPLAY_DTYPE = "LOCKSTEP_DTYPE"  # "float64" in a failed numeric check's replay


def replay_dtype() -> str | None:
    """ "float64" in a replay, then torch's default dtype too."""
    dtype = os.environ.get(REPLAY_DTYPE) or None
    if dtype == "float64":
        import torch

        torch.set_default_dtype(torch.float64)
    return dtype


def protocol() -> Protocol:
    env = os.environ
    replay_dtype()
    if env.get("LOCKSTEP_METRICS"):
        state_digest.observe(1)
    return Protocol(
        metrics=Path(env["LOCKSTEP_METRICS"]) if env.get("LOCKSTEP_METRICS") else None,
        max_steps=int(env["LOCKSTEP_MAX_STEPS"]) if env.get("LOCKSTEP_MAX_STEPS") else None,
        checkpoint_dir=(
            Path(env["LOCKSTEP_CHECKPOINT_DIR"]) if env.get("LOCKSTEP_CHECKPOINT_DIR") else None
        ),
        resume=env.get("LOCKSTEP_RESUME") == "1",
    )


def _rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _plain(value):
    """A value as JSON holds it; text redacted."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str):
        from lockstep.redact import scrub_text

        return scrub_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def metrics_path(rank: int | None = None) -> str | None:
    """Where this rank writes: rank 0 only, unless the path holds `{rank}`."""
    path = os.environ.get("LOCKSTEP_METRICS")
    if not path:
        return None
    rank = _rank() if rank is None else rank
    if RANK_PLACEHOLDER in path:
        return path.replace(RANK_PLACEHOLDER, str(rank))
    return path if rank == 0 else None


WATCH = "LOCKSTEP_WATCH"  # where `watch` writes, in a replay
_watched: list = []  # (model, Recorder, path) of `watch`


def watch(model) -> None:
    """In a failed check's replay, make every `log` write per-module digests (forensics)."""
    path = os.environ.get(WATCH)
    if not path:
        return
    from lockstep.module_digest import Recorder

    rank = os.environ.get("RANK", "0")
    _watched.append((model, Recorder(model), Path(path.replace(RANK_PLACEHOLDER, rank))))


def _write_watched(step: int) -> None:
    from lockstep.module_digest import digest

    for model, recorder, path in _watched:
        named = list(model.named_parameters())
        recorder.grads = [(n, digest(p.grad)) for n, p in named if p.grad is not None]
        recorder.end_step(step, 1.0, {n: p for n, p in named})
        line = recorder.records.pop().to_json()
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def log(step: int, *, model=None, **metrics) -> None:
    """Record one optimizer step's metrics; `model=` adds the state digests."""
    if _watched:
        _write_watched(int(step))
    seen = {}
    if os.environ.get("LOCKSTEP_METRICS"):
        seen = state_digest.observed(model)
        state_digest.observe(int(step) + 1)  # no protocol() call: hooked from the next step
    rank = _rank()
    path = metrics_path(rank)
    if rank != 0 and path is None:
        return
    record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
    own = {"time"} - set(metrics)  # fields lockstep added: kept out of wandb
    record.setdefault("time", _time.time())
    if path is not None:
        each = RANK_PLACEHOLDER in os.environ["LOCKSTEP_METRICS"]
        if model is not None:
            # every rank writes: sharded parameters are gathered
            record["param_digest"] = state_digest.param_digest(model, gather=each)
        record.update({k: v for k, v in seen.items() if k != "buffers" or each})
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    wandb = sys.modules.get("wandb")
    if rank == 0 and wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.log(
            {k: v for k, v in record.items() if k != "step" and k not in own and k in metrics},
            step=record["step"],
            commit=True,
        )


def finish(code: int = 0) -> NoReturn:
    """End a distributed script by `os._exit`, skipping the finalization in which gloo can
    abort; atexit handlers do not run."""
    import logging

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    logging.shutdown()
    from lockstep import compat

    compat.remove_temporary_folders()  # wandb's: exit would have removed them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def as_float(value) -> float:
    """A metric as `log` wrote it, as a float (else NaN)."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read(path: str | Path, missing: str = "") -> list[dict]:
    """Every object of a metrics JSONL; a bad file or line is a UsageError."""
    from lockstep.errors import UsageError

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no metrics at {path}" + (f": {missing}" if missing else ""))
    from lockstep.inputs import load_json, read_text

    text = read_text(path, "metrics")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        record = load_json(line, f"{path}:{number}")
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number}: not a JSON object")
        records.append(record)
    return records
