"""How each metric is judged: which way is better, and the smallest tolerance it may get.

Tolerances come from the spread of repeated runs (`golden.build`), never tighter than these
floors; a metric whose repeats were bitwise identical is compared exactly. Curves are
two-sided (any departure means the training changed; the direction only says whether it got
better or worse). Performance figures fail past their threshold in the worse direction, and
also past twice the threshold in the better one: a golden that a change beats by that much is
stale and must be refreshed, or it would hide the next regression.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    direction: str  # "lower", "higher" or "none" (no better side)
    floor_rel: float = 0.0
    floor_abs: float = 0.0


# Per-step training curves. Megatron-LM's floor is 0.1% and its factor 1.5 (CURVE_FACTOR).
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

# Run-level performance figures (`run.summary`). The threshold is the larger of the floor and
# PERF_FACTOR times the relative spread the repeats showed.
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
# A relative speed or memory threshold wider than this (the repeats were that noisy) would let
# most regressions a team wants caught pass: the figure is NOT JUDGED (exit 4), saying why and
# to record the golden again with more repeats on a quieter machine.
PERF_JUDGED_REL = 0.25
TOO_GOOD_FACTOR = 2.0
# Speed figures from inside the run beat the wall time measured from outside, which also
# holds the process start; wall time is gated only for a run that logs no step timing.
TIME_FIGURES = ("step_time_s", "tokens_per_s")


def curve_policy(metric: str) -> Policy:
    return CURVES.get(metric, DEFAULT_CURVE)


def failing_step_budget(steps: int, exact: bool) -> int:
    """Steps an approximate curve may fail (Megatron-LM: min(max(N//100, 1), 50)); none for
    an exact one."""
    return 0 if exact else min(max(steps // 100, 1), 50)


def window_size(steps: int) -> int:
    """Steps per window for the windowed means: ten windows, the last being the final mean."""
    return max(1, steps // 10)
