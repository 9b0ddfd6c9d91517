"""Every invariant check by name: what it catches and the functions that run it (`rank`,
`plan`, `script`), named as lazy references so that the CLI reads the table without torch. A new
check is one file of `lockstep.checks` and one row of `CHECKS`. Design: docs/design/checks.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.errors import UsageError
from lockstep.registry import Ref, Registry


class Function(Ref):
    """A function of `lockstep.checks.<module>`: `Function("resume", "plan")`."""

    def __init__(self, module: str, name: str):
        super().__init__(f"lockstep.checks.{module}:{name}")

    @property
    def module(self) -> str:
        """Its module's name in `lockstep.checks` (progress lines show it)."""
        return self.path.rpartition(".")[2]


def rank(module: str) -> Function:
    """The rank-side function of the check in `module`: `check_<module>`."""
    return Function(module, f"check_{module}")


def plan(module: str) -> Function:
    return Function(module, "plan")


@dataclass(frozen=True)
class OnScript:
    """How a check runs on a user's script: `run(runner, runs, rtol=, atol=)`, its default
    tolerances (None: compared exactly), and the ranks below which `all` leaves it out."""

    run: Function
    tolerance: tuple[float, float] | None = (0.0, 0.0)
    min_nproc: int = 1

    def tolerances(self, rtol: float | None, atol: float | None) -> dict[str, float]:
        if self.tolerance is None:
            return {}
        return {
            "rtol": self.tolerance[0] if rtol is None else rtol,
            "atol": self.tolerance[1] if atol is None else atol,
        }


@dataclass(frozen=True)
class Check:
    name: str
    catches: str
    rank: Function | None = None
    plan: Function | None = None
    script: OnScript | None = None
    # on a CONFIG: the ranks it needs, and why (the one-line error below them)
    min_nproc: tuple[int, str] = (1, "")

    def require_ranks(self, nproc: int) -> None:
        least, why = self.min_nproc
        if nproc < least:
            raise UsageError(f"the {self.name} check {why}: run it with --nproc {least} or more")


def on_script(module: str, **options) -> OnScript:
    return OnScript(Function(module, "check_script"), **options)


CHECKS: Registry[Check] = Registry("check", [
    Check("determinism", "unseeded data order, sampling or init; nondeterministic kernels",
          rank=rank("determinism"), script=on_script("determinism")),
    Check("resume", "a resume that forgets the LR schedule, RNG state, data position or "
          "optimizer", rank=rank("resume"), plan=plan("resume"),
          script=on_script("resume")),
    Check("clip", "gradient clipping on a local shard (every norm type)",
          rank=Function("clip", "check_clip_norm_types")),
    Check("equivalence", "a sharded engine computing other numbers than DDP",
          rank=rank("equivalence")),
    Check("world-size", "a loss or norm that depends on the world size",
          rank=rank("world_size"), plan=plan("world_size"),
          script=on_script("world_size")),
    Check("accumulation", "gradient accumulation that differs from the large batch",
          rank=rank("accumulation")),
    Check("replicas", "replicas that depart: a buffer never broadcast, a rank-dependent "
          "seed, a gradient left out of averaging", rank=rank("replicas"),
          script=on_script("replicas", tolerance=None, min_nproc=2)),
    Check("elastic", "a restart after a killed rank that does not resume exactly",
          plan=plan("elastic"), min_nproc=(2, "kills rank 1")),
])  # fmt: skip


def names(script: bool = False) -> tuple[str, ...]:
    """The checks, in the order `all` runs them; with `script`, those that run on a script."""
    return tuple(name for name, c in CHECKS.items() if c.script is not None or not script)


def shared(selected: tuple[str, ...]) -> tuple[str, ...]:
    """Of `selected`, those that run together in one launch."""
    return tuple(name for name in selected if CHECKS[name].plan is None)
