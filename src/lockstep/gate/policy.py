"""How each metric is judged: which way is better, and the smallest tolerance it may get.
Design: docs/design/gates.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    direction: str  # "lower", "higher" or "none" (no better side)
    floor_rel: float = 0.0
    floor_abs: float = 0.0


# Per-step training curves: Megatron-LM's floor (0.1%) and factor (CURVE_FACTOR).
CURVES = {
    "loss": Policy("lower", floor_rel=1e-3),
    "grad_norm": Policy("none", floor_rel=1e-3),
    "lr": Policy("none", floor_rel=1e-6),
    "clip_coef": Policy("none", floor_rel=1e-3),
    "loss_scale": Policy("none", floor_rel=0.0),
}
DEFAULT_CURVE = Policy("none", floor_rel=1e-3)
SCRIPT_STEPS = 20  # a script's optimizer steps per gate run where no --steps says
CURVE_FACTOR = 1.5

# Run-level figures (`run_result.summary`): max(floor, PERF_FACTOR × the repeats' spread).
PERF = {
    "step_time_s": Policy("lower", floor_rel=0.10),
    "tokens_per_s": Policy("higher", floor_rel=0.10),
    "mem_bytes": Policy("lower", floor_rel=0.05),
    "mem_growth_bytes": Policy("lower", floor_abs=32 * 2**20),
    "peak_rss_bytes": Policy("lower", floor_rel=0.10),
    "gpu_mem_bytes": Policy("lower", floor_rel=0.05),
    "wall_s": Policy("lower", floor_rel=0.20),
}
PERF_FACTOR = 3.0
# A wider relative threshold would let most regressions pass: NOT JUDGED (exit 4) instead.
PERF_JUDGED_REL = 0.25
TOO_GOOD_FACTOR = 2.0
# Gated before wall time, which holds the process start too: wall time only without these.
TIME_FIGURES = ("step_time_s", "tokens_per_s")


def curve_policy(metric: str) -> Policy:
    return CURVES.get(metric, DEFAULT_CURVE)


def failing_step_budget(steps: int, exact: bool) -> int:
    """Steps an approximate curve may fail (as Megatron-LM); none for an exact one."""
    return 0 if exact else min(max(steps // 100, 1), 50)


def window_size(steps: int) -> int:
    """Steps per window for the windowed means: ten windows, the last being the final mean."""
    return max(1, steps // 10)
