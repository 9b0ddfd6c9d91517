"""Checkpoints that hold everything a resume needs, published atomically, verified on load.

Layout, publication, retention and safe loading: docs/design/train.md."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import secrets
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lockstep.errors import RankTimeout, UsageError
from lockstep.inputs import read_json, read_text
from lockstep.train import engine_table

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = "lockstep.checkpoint/1"
STEP_DIR = re.compile(r"step_(\d{8})")
RESAVE_PREFIX = ".resave-"
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
            "format": FORMAT,
            "step": step,
            "engine": engine.cfg.engine.name,
            "world_size": dist.get_world_size(),
            "files": {str(p.relative_to(tmp)): [p.stat().st_size, _sha256(p)] for p in _files(tmp)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        publish(root, tmp, name)
        retain(root, keep)
    barrier("checkpoint: publishing")
    return final


def _point(root: Path, name: str) -> None:
    """Replace `latest` with `name` atomically."""
    pointer = root / f".{LATEST}.tmp"
    with pointer.open("w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, root / LATEST)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)


def publish(root: Path, tmp: Path, name: str) -> Path:
    """Move the complete checkpoint `tmp` to root/name and point `latest` at it: `latest`
    names a complete checkpoint at every instant, wherever the process is killed."""
    final = root / name
    if final.exists():  # a re-save, which `latest` may name: point it at a linked copy first
        staged = root / f"{RESAVE_PREFIX}{name}-{secrets.token_hex(4)}"
        shutil.copytree(tmp, staged, copy_function=_link_or_copy)
        _point(root, staged.name)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _point(root, name)
    for stale in root.glob(f"{RESAVE_PREFIX}step_*"):  # `latest` names none of them now
        shutil.rmtree(stale, ignore_errors=True)
    return final


def written_by_lockstep(path: Path) -> int | None:
    """The step of a checkpoint folder lockstep wrote (`step_` and 8 digits, holding a manifest
    of that step), else None."""
    match = STEP_DIR.fullmatch(path.name)
    if not match or not path.is_dir():
        return None
    try:
        manifest = read_json(path / MANIFEST, "checkpoint manifest")
    except UsageError:
        return None
    step = int(match.group(1))
    ours = isinstance(manifest, dict) and manifest.get("step") == step
    return step if ours and isinstance(manifest.get("files"), dict) else None


def published(root: Path) -> list[Path]:
    """lockstep's checkpoints under `root`, oldest step first."""
    found = [(written_by_lockstep(p), p) for p in root.glob("step_*")]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)]


def _damaged(root: Path) -> list[Path]:
    """lockstep's checkpoints whose manifest was lost: `step_` + 8 digits holding an engine
    folder or rng/, but no readable manifest."""
    return [
        p
        for p in root.glob("step_*")
        if STEP_DIR.fullmatch(p.name)
        and written_by_lockstep(p) is None
        and any((p / part).is_dir() for part in ("dcp", "deepspeed", "rng"))
    ]


def retain(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` of lockstep's checkpoints (never the one `latest`
    names); returns what it deleted."""
    try:
        current = read_text(root / LATEST, "checkpoint pointer").strip()
    except UsageError:
        current = None
    doomed = [p for p in published(root)[:-keep] if p.name != current] if keep > 0 else []
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


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
        # never skipped silently, damaged ones included: the user says what to do
        ours = sorted({*published(root), *_damaged(root)})
        if ours:
            raise UsageError(
                f"{root} holds {ours[-1].name} but no '{LATEST}' pointer; set "
                f"checkpoint.resume to the directory to use, or 'never' to start afresh"
            )
        return None
    path = root / read_text(pointer, "checkpoint pointer").strip()
    if not path.is_dir():
        raise UsageError(
            f"{pointer} names {path.name}, which does not exist; the checkpoint is lost"
        )
    return path


def verify(path: Path) -> dict[str, Any]:
    """The manifest, after checking every file's size and sha256; UsageError naming the damage."""
    manifest_path = path / MANIFEST
    try:
        manifest = read_json(manifest_path, "checkpoint manifest")
        files = manifest["files"]
    except (UsageError, KeyError, TypeError) as err:
        why = f" ({err})" if isinstance(err, UsageError) else ""
        raise UsageError(
            f"checkpoint {path} is incomplete or corrupt: no readable {MANIFEST}{why}"
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
    """UsageError unless `engine` resumes checkpoints of the engine that wrote this one."""
    saved = manifest["engine"]
    if not engine_table.resumes(saved, engine):
        shared = "; ".join(
            f"{engine_table.series(group, 'and')} can load each other's"
            for group in engine_table.shared_checkpoints()
        )
        raise UsageError(
            f"checkpoint {path} was written by engine '{saved}', this run uses '{engine}'; "
            f"resume with the same engine{f' ({shared})' if shared else ''}"
        )


def load(engine, path: Path) -> dict[str, Any]:
    """Collective: rank 0 verifies and prepares the checkpoint for this world size, every
    rank restores; returns the client state."""
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
        set_rng_state(load_file(rng_file))
    return client


def _allowed_globals() -> list:
    """Beyond tensors and plain containers, lockstep's files hold numpy's RNG state."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_file(path: Path, map_location: str | None = "cpu") -> Any:
    """`torch.load` of a file lockstep wrote, `weights_only=True`: a file planted in a shared
    checkpoint folder cannot run code."""
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"{path}: refusing to unpickle it: it holds more than lockstep writes ({first})"
        ) from None
