"""Every invariant check by name: what it catches, how it is launched on the reference job
(`lockstep check NAME CONFIG`) and whether it runs on a user's script (`--script`).

A new check is one entry here, its function in `harness.py` (rank side, on the reference job)
and, if it runs on scripts, one in `script.py`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    catches: str
    # "shared": one training launch that `all` shares with the other shared checks;
    # "resume": a launch that checkpoints, then a new one (maybe at another world size) that
    # resumes; "world-sizes": one launch per world size; "elastic": a launch that kills a rank
    # and restarts.
    launch: str
    on_script: bool


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check("determinism", "unseeded data order, sampling or init; nondeterministic kernels",
              "shared", on_script=True),
        Check("resume", "a resume that forgets the LR schedule, RNG state, data position or "
              "optimizer", "resume", on_script=True),
        Check("clip", "gradient clipping on a local shard (every norm type)", "shared",
              on_script=False),
        Check("equivalence", "a sharded engine computing other numbers than DDP", "shared",
              on_script=False),
        Check("world-size", "a loss or norm that depends on the world size", "world-sizes",
              on_script=True),
        Check("accumulation", "gradient accumulation that differs from the large batch",
              "shared", on_script=False),
        Check("replicas", "replicas that depart: a buffer never broadcast, a rank-dependent "
              "seed, a gradient left out of averaging", "shared", on_script=True),
        Check("elastic", "a restart after a killed rank that does not resume exactly",
              "elastic", on_script=False),
    )
}  # fmt: skip


def names(script: bool = False) -> tuple[str, ...]:
    """The checks, in the order `all` runs them; with `script`, those that run on a script."""
    return tuple(name for name, c in CHECKS.items() if c.on_script or not script)


def shared(selected: tuple[str, ...]) -> tuple[str, ...]:
    """Of `selected`, those that run together in one launch."""
    return tuple(name for name in selected if CHECKS[name].launch == "shared")
