"""The metrics side of the black-box protocol: what a user's training script calls.

`lockstep check ... --script CMD` launches CMD with these variables set:

- `LOCKSTEP_METRICS`: a JSONL path; rank 0 writes one object per optimizer step. When the
  path contains `{rank}` (the replicas check), every rank writes its own file, `{rank}`
  replaced by its rank;
- `LOCKSTEP_MAX_STEPS`: stop after that optimizer step, leaving a checkpoint;
- `LOCKSTEP_CHECKPOINT_DIR`: where checkpoints go;
- `LOCKSTEP_RESUME`: `1` to resume from the latest checkpoint there, else `0`;
- `LOCKSTEP_DTYPE`: `float64` only in the replay of a failed world-size check (`replay_dtype`).

`log(step, loss=..., grad_norm=..., lr=..., model=model)` writes those lines and forwards
them to wandb (rank 0) when a run is active. Outside a check, with LOCKSTEP_METRICS unset,
it only forwards to wandb, so a script can call it unconditionally. `finish()` ends the script
without the gloo abort at interpreter exit.

Fields of a line (`step` and `loss` required, the rest optional):

    step          int    optimizer step, 1-based
    loss          float  the step's loss (the mean over ranks, so that every rank logs the same)
    grad_norm     float  global gradient norm before clipping
    lr            float  learning rate used by this step
    time          float  unix time at the call (end of the step); added by `log` unless given
    tokens_per_s  float  throughput of the step
    step_time_s   float  wall time of the step
    mem_bytes     int    peak accelerator memory (or CPU RSS) of the step
    skipped       bool   the optimizer skipped this step's update (fp16 loss scaling found
                         inf or NaN); a non-finite grad_norm is then a note, not a failure
    param_digest  str    with `model=`: exact checksum of this rank's parameters
    buffer_digest str    with `model=`: the same over its buffers (BatchNorm running stats...)
                         as the step's first forward entered the model, after a DDP
                         wrapper's broadcast; absent where that forward was not seen
    param_digest_in str  a run's first line: the parameters its forward entered with (what
                         a resume loaded), where `protocol()` came before it
    buffers       dict   per-rank files only: each buffer's own checksum, by name
    local_batch   dict   in a check's run (LOCKSTEP_LOCAL_BATCH): dropout and local-batch
                         BatchNorm its forwards call (`lockstep.local_batch`), the first step
                         watched, and whether each was switched off

Checks compare `loss`, `grad_norm` and `lr` (and the digests across ranks); `time`,
`tokens_per_s`, `step_time_s` and `mem_bytes` differ between runs by nature and are never
compared exactly (the regression gates use them).
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
# A script's command line may name the variables as placeholders, `{metrics}` for
# LOCKSTEP_METRICS...: the fields of `Protocol`, in order.
PLACEHOLDERS = ("metrics", "max_steps", "checkpoint_dir", "resume")


@dataclass(frozen=True)
class Protocol:
    """The protocol's variables: what `protocol()` reads in a script, and what lockstep's
    launcher (`lockstep.launch.script`) writes for it (`environ`, `values`)."""

    metrics: Path | None
    max_steps: int | None
    checkpoint_dir: Path | None
    resume: bool

    def values(self) -> dict[str, str]:
        """Each placeholder's text (`PLACEHOLDERS`); an unset one is empty."""
        return {
            "metrics": "" if self.metrics is None else str(self.metrics),
            "max_steps": "" if self.max_steps is None else str(self.max_steps),
            "checkpoint_dir": "" if self.checkpoint_dir is None else str(self.checkpoint_dir),
            "resume": "1" if self.resume else "0",
        }

    def environ(self) -> dict[str, str]:
        """The LOCKSTEP_* variables that `protocol()` reads back as this."""
        return {f"LOCKSTEP_{name.upper()}": text for name, text in self.values().items()}

    def metrics_of(self, rank: int) -> Path | None:
        """The file `rank` writes when the path holds `{rank}`; else the one path."""
        if self.metrics is None:
            return None
        return Path(str(self.metrics).replace(RANK_PLACEHOLDER, str(rank)))


REPLAY_DTYPE = "LOCKSTEP_DTYPE"  # "float64": a failed numeric check's replay (`replay_dtype`)


def replay_dtype() -> str | None:
    """ "float64" when lockstep replays this run in float64 to tell rounding noise from a
    real difference (world-size check); `protocol()` then makes float64 torch's default
    dtype, so a model and data built after it are float64. A script that casts explicitly
    (`.float()`, `dtype=torch.float32`) should use this dtype instead."""
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
    """Tensors and numpy scalars become Python numbers; NaN and inf become strings (JSON); a
    string is redacted (`lockstep.redact`): checks quote the values they compare."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str):
        from lockstep.redact import scrub_text

        return scrub_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def metrics_path(rank: int | None = None) -> str | None:
    """Where this rank writes, or None: rank 0 only, unless the path holds `{rank}`."""
    path = os.environ.get("LOCKSTEP_METRICS")
    if not path:
        return None
    rank = _rank() if rank is None else rank
    if RANK_PLACEHOLDER in path:
        return path.replace(RANK_PLACEHOLDER, str(rank))
    return path if rank == 0 else None


WATCH = "LOCKSTEP_WATCH"  # a JSONL path ({rank}): the module digests of a failed check's replay
_watched: list = []  # (model, Recorder, path) of `watch`


def watch(model) -> None:
    """Let a failed check name the module where two runs part (docs/forensics.md): call it
    once with the model, before training. A no-op unless lockstep replays the run with
    LOCKSTEP_WATCH set; then every `log` writes this rank's per-module digests (forward
    outputs, the gradients present at the call, the parameters) to that file."""
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
    """Record one optimizer step's metrics: rank 0 writes (every rank, when LOCKSTEP_METRICS
    holds `{rank}`); other ranks return at once. `model=` adds this rank's `param_digest`
    and `buffer_digest`; `time` (unix seconds, now) is added unless given."""
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
            # every rank digests when every rank writes: sharded parameters are gathered
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
    """End a script that trained under torch.distributed, without Python's finalization: a
    barrier, the process group destroyed, a wandb run finished, logs and output flushed, then
    `os._exit(code)`.

    Why: on gloo (torch 2.13) `destroy_process_group()` does not stop the group's worker
    threads. A worker still releasing a collective's tensors (their Python objects need the
    GIL) when the interpreter finalizes is made to exit inside a noexcept destructor, and the
    rank dies of SIGABRT ("terminate called without an active exception"). Rare, and more so
    the larger the heap; not ending through finalization rules it out. atexit handlers do not
    run: close what the script opened before calling this (the temporary folders libraries
    made for themselves, as wandb does at import, are removed).
    """
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

    compat.remove_temporary_folders()  # wandb's, made at its import: exit would remove them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def as_float(value) -> float:
    """A metric value as `log` wrote it, as a float: numbers, and the strings it writes for
    NaN and inf (`'nan'`, `'inf'`, `'-inf'`); anything else (None, a string) is NaN."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read(path: str | Path, missing: str = "") -> list[dict]:
    """Every JSON object of a metrics JSONL, in order: the one reader of what `log` (and
    `lockstep train`) writes. A missing or unreadable file, a corrupt line or a line that is no
    object is bad input, named with its line; `missing` says what should have written it."""
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
