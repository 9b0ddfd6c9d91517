"""lockstep's reference job (`lockstep train CONFIG`) as a job someone else runs: the gate
(`gate/job.py`) launches it as a black box, like a script, and needs only what this module
reads from its config: the steps, the settings that key a golden's environment, a digest of
the resolved config, the extras it needs and its command line.

Here, outside both packages, because `lockstep.gate` does not import `lockstep.train`: the
config model stays `train.config`'s, and this is the one place the gate learns from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReferenceJob:
    """A run config with `--set` overrides, loaded and checked for `nproc` ranks (`load`)."""

    config: Path
    overrides: tuple[str, ...]
    nproc: int
    cfg: Any  # train.config.RunConfig

    @property
    def steps(self) -> int:
        return self.cfg.steps

    def settings(self) -> dict:
        """The job's own key fields of a golden's environment (`gate.envkey.environment`)."""
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
        """The resolved config as JSON: what the job's digest is taken over."""
        return self.cfg.model_dump_json()

    def require_extras(self, what: str) -> None:
        """One line naming a missing extra (`lockstep.extras`), before any rank starts."""
        from lockstep.train.config import require_config

        require_config(what, self.cfg)

    def argv(
        self, workdir: Path, cwd: Path | None = None, extra: tuple[str, ...] = ()
    ) -> list[str]:
        """`-m lockstep train CONFIG --out WORKDIR --set ...` (the overrides, then `extra`);
        with `cwd` (another version's tree), that version's config where it has one."""
        config = self.config
        if cwd is not None and (cwd / self.config).is_file():
            config = cwd / self.config
        argv = ["-m", "lockstep", "train", str(Path(config).resolve()), "--out", str(workdir)]
        return argv + [a for o in (*self.overrides, *extra) for a in ("--set", o)]


def load(config: Path, overrides: list[str], nproc: int, steps: int | None = None) -> ReferenceJob:
    """The config with its overrides (and `steps`), checked for `nproc` ranks (UsageError
    when not)."""
    from lockstep.train.config import load_config

    cfg = load_config(config, [*overrides, *([f"steps={steps}"] if steps else [])])
    cfg.check(nproc)
    return ReferenceJob(Path(config), tuple(overrides), nproc, cfg)
