"""lockstep's reference job (`lockstep train CONFIG`) as the gate launches it: what the gate
needs from its config. Outside both packages: the gate does not import `lockstep.train`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReferenceJob:
    """A run config with `--set` overrides, checked for `nproc` ranks."""

    config: Path
    overrides: tuple[str, ...]
    nproc: int
    cfg: Any  # train.config.RunConfig

    @property
    def steps(self) -> int:
        return self.cfg.steps

    def settings(self) -> dict:
        """Its fields of a golden's environment key."""
        from lockstep.train.engine_table import ENGINES

        cfg = self.cfg
        return {
            "engine": cfg.engine.name,
            "deepspeed": "deepspeed" in ENGINES[cfg.engine.name].requires,
            "world_size": self.nproc,
            "precision": cfg.precision,
            "deterministic": cfg.deterministic,
            "device": cfg.resolved_device(),
        }

    def resolved(self) -> str:
        """The resolved config as JSON."""
        return self.cfg.model_dump_json()

    def require_extras(self, what: str) -> None:
        """One line naming a missing extra, before any rank starts."""
        from lockstep.train.config import require_config

        require_config(what, self.cfg)

    def argv(
        self, workdir: Path, cwd: Path | None = None, extra: tuple[str, ...] = ()
    ) -> list[str]:
        """`-m lockstep train CONFIG ...`; with `cwd`, that tree's config where it has one."""
        config = self.config
        if cwd is not None and (cwd / self.config).is_file():
            config = cwd / self.config
        argv = ["-m", "lockstep", "train", str(Path(config).resolve()), "--out", str(workdir)]
        return argv + [a for o in (*self.overrides, *extra) for a in ("--set", o)]


def load(config: Path, overrides: list[str], nproc: int, steps: int | None = None) -> ReferenceJob:
    """The config with its overrides, checked for `nproc` ranks."""
    from lockstep.train.config import load_config

    cfg = load_config(config, [*overrides, *([f"steps={steps}"] if steps else [])])
    cfg.check(nproc)
    return ReferenceJob(Path(config), tuple(overrides), nproc, cfg)
