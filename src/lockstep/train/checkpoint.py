"""Checkpoints that hold everything a resume needs, published atomically, verified on load.

Layout under the checkpoint root (a directory every rank sees):

    latest                  -> the name of the newest complete checkpoint ("step_00000010")
    step_00000010/
      deepspeed/ | dcp/     the engine's own format (DeepSpeed save_checkpoint, or
                            torch.distributed.checkpoint for ddp/fsdp + trainer_state.pt)
      universal/            DeepSpeed's universal checkpoint, made from deepspeed/ on the first
                            ZeRO resume at another world size (not in the manifest)
      rng/rank00000.pt      python, numpy, torch and cuda RNG state of each rank
      manifest.json         written last: step, engine, world size, size and sha256 of every file

Ranks write into `.tmp-step_...`; rank 0 writes the manifest, renames the directory and then
replaces `latest` (write + os.replace), so a crash mid-save never leaves a half checkpoint
where a resume would find it. Loading re-hashes every file against the manifest: a truncated
or altered checkpoint is an error that names it, never a silent fresh start.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lockstep.errors import RankTimeout, UsageError

MANIFEST = "manifest.json"
LATEST = "latest"
BARRIER_TIMEOUT = timedelta(minutes=10)


def barrier(what: str, timeout: timedelta = BARRIER_TIMEOUT) -> None:
    """A barrier that ends in RankTimeout naming the missing ranks (gloo) instead of hanging."""
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        except RuntimeError as exc:
            raise RankTimeout(f"{what}: {str(exc).splitlines()[0]}") from None
    else:
        dist.barrier()


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def save(engine, root: Path, step: int, client_state: dict[str, Any], keep: int) -> Path:
    """Collective: every rank writes its part; returns the published checkpoint directory."""
    rank = dist.get_rank()
    name = f"step_{step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    barrier("checkpoint: creating the directory")
    engine.save(tmp, client_state)
    torch.save(rng_state(), tmp / "rng" / f"rank{rank:05d}.pt")
    barrier("checkpoint: writing shards")
    if rank == 0:
        manifest = {
            "step": step,
            "engine": engine.cfg.engine.name,
            "world_size": dist.get_world_size(),
            "files": {str(p.relative_to(tmp)): [p.stat().st_size, _sha256(p)] for p in _files(tmp)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(name + "\n")
        os.replace(pointer, root / LATEST)
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier("checkpoint: publishing")
    return final


def find(root: Path, resume: str) -> Path | None:
    """The checkpoint to resume from: `resume` is auto, never, or a path."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise UsageError(f"checkpoint.resume: no checkpoint directory {path}")
        return path
    pointer = root / LATEST
    if not pointer.exists():
        published = sorted(root.glob("step_*"))
        if published:
            raise UsageError(
                f"{root} holds {published[-1].name} but no '{LATEST}' pointer; set "
                f"checkpoint.resume to the directory to use, or 'never' to start afresh"
            )
        return None
    path = root / pointer.read_text().strip()
    if not path.is_dir():
        raise UsageError(
            f"{pointer} names {path.name}, which does not exist; the checkpoint is lost"
        )
    return path


def verify(path: Path) -> dict[str, Any]:
    """The manifest, after checking every file's size and sha256; UsageError naming the damage."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError):
        raise UsageError(
            f"checkpoint {path} is incomplete or corrupt: no readable {MANIFEST}"
        ) from None
    for rel, (size, digest) in files.items():
        file = path / rel
        if not file.is_file():
            raise UsageError(f"checkpoint {path} is corrupt: {rel} is missing")
        if file.stat().st_size != size:
            raise UsageError(
                f"checkpoint {path} is corrupt: {rel} has {file.stat().st_size} bytes, expected "
                f"{size} (truncated?); resume from an earlier checkpoint or set checkpoint.resume"
            )
        if _sha256(file) != digest:
            raise UsageError(f"checkpoint {path} is corrupt: {rel} does not match its sha256")
    return manifest


def check_compatible(manifest: dict[str, Any], path: Path, engine: str) -> None:
    """ddp and fsdp share DCP and can load each other's; ZeRO loads its own stage only."""
    saved = manifest["engine"]
    native = {"ddp", "fsdp"}
    if saved != engine and not {saved, engine} <= native:
        raise UsageError(
            f"checkpoint {path} was written by engine '{saved}', this run uses '{engine}'; "
            "resume with the same engine (ddp and fsdp can load each other's)"
        )


def load(engine, path: Path) -> dict[str, Any]:
    """Collective: rank 0 verifies and lets the engine prepare the checkpoint for this world
    size (ZeRO converts it to DeepSpeed's universal checkpoint; DCP reshards ddp/fsdp
    checkpoints by itself), every rank restores; returns the client state."""
    answer: list[Any] = [None, None]  # error, saved world size
    if dist.get_rank() == 0:
        try:
            manifest = verify(path)
            check_compatible(manifest, path, engine.cfg.engine.name)
            answer[1] = manifest["world_size"]
            engine.prepare_load(path, answer[1])
        except UsageError as exc:
            answer[0] = str(exc)
    dist.broadcast_object_list(answer, src=0)
    error, saved_world_size = answer
    if error:
        raise UsageError(error)
    client = engine.load(path, saved_world_size)
    rng_file = path / "rng" / f"rank{dist.get_rank():05d}.pt"
    if rng_file.exists():  # absent when resuming at a larger world size: keep the fresh seed
        set_rng_state(torch.load(rng_file, weights_only=False))
    return client
