"""Training state at one step, captured from a live `Trainer`, and compared part by part, so
that a failed resume check names the part lost.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from lockstep.train import checkpoint


def rows(steps) -> list[dict]:
    """StepMetrics (or dicts) as the plain records `trajectory.first_divergence` compares."""
    return [s if isinstance(s, dict) else asdict(s) for s in steps]


def _rng_digest() -> str:
    """This rank's python, numpy and torch RNG streams, hashed (they differ per rank)."""
    state = checkpoint.rng_state()
    blob = pickle.dumps(
        [state["python"], state["numpy"][1].tobytes(), state["torch"].numpy().tobytes()]
    )
    return hashlib.sha256(blob).hexdigest()


def snapshot(trainer) -> dict[str, Any]:
    """Everything a resume must restore, taken between optimizer steps (collective)."""
    return {
        "step": trainer.step,
        "parameters": trainer.engine.full_parameters(),
        "optimizer": trainer.engine.full_optimizer_state(),
        "LR schedule": (trainer.engine.lr(), trainer.engine.lr_schedule_step()),
        "RNG": _rng_digest(),
        "data position": trainer.stream.position,
    }


def first_tensor_difference(
    want: dict, got: dict, rtol: float = 0.0, atol: float = 0.0, prefix: str = ""
) -> str | None:
    """'name: max |diff| x' for the first (nested) tensor entry that differs, else None."""
    for key in sorted(set(want) | set(got)):
        label = f"{prefix}{key}"
        if key not in want or key not in got:
            return f"{label} present in only one of them"
        a, b = want[key], got[key]
        if isinstance(a, dict):
            found = first_tensor_difference(a, b, rtol, atol, f"{label}.")
            if found:
                return found
            continue
        if a.shape != b.shape:
            return f"{label} shape {tuple(a.shape)} vs {tuple(b.shape)}"
        close = torch.equal(a, b) if rtol == atol == 0 else torch.allclose(b, a, rtol, atol)
        if not close:
            return f"{label} max |diff| {float((a - b).abs().max()):.3g}"
    return None


def differences(
    want: dict[str, Any],
    got: dict[str, Any],
    rtol: float = 0.0,
    atol: float = 0.0,
    param_atol: float | None = None,
) -> dict[str, str]:
    """Which parts of two snapshots differ, described; the same on every rank (the RNG with
    the ranks where it differs). `param_atol` (default `atol`) loosens parameters only."""
    found: dict[str, str] = {}
    for part in ("parameters", "optimizer"):
        tol = atol if part == "optimizer" or param_atol is None else param_atol
        diff = first_tensor_difference(want[part], got[part], rtol, tol)
        if diff:
            found[part] = diff
    if want["LR schedule"] != got["LR schedule"]:
        (lr_a, epoch_a), (lr_b, epoch_b) = want["LR schedule"], got["LR schedule"]
        found["LR schedule"] = f"lr {lr_a!r} vs {lr_b!r}, scheduler step {epoch_a} vs {epoch_b}"
    if want["data position"] != got["data position"]:
        found["data position"] = f"{want['data position']} vs {got['data position']} steps"
    rng_differs = want["RNG"] is not None and got["RNG"] is not None and want["RNG"] != got["RNG"]
    flags = [None] * dist.get_world_size() if dist.is_initialized() else [rng_differs]
    if dist.is_initialized():
        dist.all_gather_object(flags, rng_differs)
    bad = [r for r, f in enumerate(flags) if f]
    if bad:
        found["RNG"] = f"RNG state differs on rank(s) {', '.join(map(str, bad))}"
    return found
