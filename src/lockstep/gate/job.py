"""The job a gate runs: the reference training (`lockstep train` CONFIG) or a user's script.

Both are started the way their users start them, through torchrun's launcher API (`-m lockstep
train` for the reference job; the script with the black-box protocol's LOCKSTEP_* variables),
one launch per run in its own folder, its ranks watched by `monitor.TreeMonitor`. A run can take its code
from another tree (the base of an A/B comparison): the script runs in that tree, the reference
job imports lockstep from that tree's `src/`.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.checks.script import script_argv
from lockstep.errors import EXIT_FAIL, LockstepError, RankTimeout, UsageError
from lockstep.gate.monitor import TreeMonitor
from lockstep.gate.run import Run, read_rows
from lockstep.launch import (
    ABORT_SIGNATURE,
    aborted_at_exit,
    last_error_line,
    rank_environment,
    run_command,
)
from lockstep.redact import scrub_text

DEFAULT_SCRIPT_STEPS = 20


class JobFailed(LockstepError):
    """The job exited non-zero (exit 1: the job, not the input, failed); the message has its
    last error line and its log."""

    exit_code = EXIT_FAIL


@dataclass
class Job:
    nproc: int = 1
    steps: int | None = None
    config: Path | None = None
    overrides: list[str] = field(default_factory=list)
    command: str | None = None
    timeout: float = 1800.0
    run_path: bool = False  # ranks forked from a process that imported torch (local_ranks)

    def __post_init__(self) -> None:
        if (self.config is None) == (self.command is None):
            raise UsageError("give the job as a CONFIG file or as --script 'CMD', not both")
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc}: need at least 1")
        if self.steps is not None and self.steps < 2:
            raise UsageError(f"--steps {self.steps}: a gate needs at least 2 steps")
        if self.command is not None and not self.command.strip():
            raise UsageError("--script needs a command, for example --script 'python train.py'")
        self._cfg = None
        if self.config is not None:
            from lockstep.train.config import load_config

            overrides = [*self.overrides, *([f"steps={self.steps}"] if self.steps else [])]
            self._cfg = load_config(self.config, overrides)
            self._cfg.check(self.nproc)
            self.steps = self._cfg.steps
        elif self.overrides:
            raise UsageError("--set applies to a CONFIG job; a script takes its settings itself")
        else:
            self.steps = self.steps or DEFAULT_SCRIPT_STEPS

    # ------------------------------------------------------------------ what it is

    def settings(self) -> dict:
        """The job's own key fields (`envkey.environment`)."""
        if self._cfg is None:
            return {"engine": "script", "world_size": self.nproc}
        cfg = self._cfg
        return {
            "engine": cfg.engine.name,
            "world_size": self.nproc,
            "precision": cfg.precision,
            "deterministic": cfg.deterministic,
            "device": cfg.resolved_device(),
        }

    def describe(self) -> dict:
        how = {"run_path": True} if self.run_path else {}
        if self._cfg is None:
            return {
                "kind": "script",
                "command": scrub_text(self.command),
                "nproc": self.nproc,
                "steps": self.steps,
                **how,
            }
        return {
            "kind": "config",
            "config": str(self.config),
            "overrides": self.overrides,
            "nproc": self.nproc,
            "steps": self.steps,
            **how,
        }

    def digest(self) -> str:
        """sha256 of the resolved config, or of the command and the script file it names."""
        h = hashlib.sha256()
        if self._cfg is not None:
            h.update(self._cfg.model_dump_json().encode())
        else:
            h.update(self.command.encode())
            for arg in shlex.split(self.command):
                if arg.endswith(".py") and Path(arg).is_file():
                    h.update(Path(arg).read_bytes())
        return "sha256:" + h.hexdigest()

    def arguments(self) -> str:
        """The job's part of a `lockstep gate` command line, for the commands we print."""
        if self._cfg is None:
            parts = ["--script", shlex.quote(scrub_text(self.command))]
        else:
            parts = [shlex.quote(str(self.config))]
            # scrubbed: these lines are printed and written to reports (a secret in an
            # override shows as <redacted:…>, which the user puts back when running it)
            parts += [f"--set {shlex.quote(scrub_text(o))}" for o in self.overrides]
        parts += [f"--nproc {self.nproc}", f"--steps {self.steps}"]
        return " ".join(parts + (["--run-path"] if self.run_path else []))

    # ------------------------------------------------------------------ running it

    def run(
        self, workdir: Path, tree: Path | None = None, cwd: Path | None = None, progress=print
    ) -> Run:
        """One launch in `workdir` (fresh). For another version of the code, `tree` is its
        repository root (its `src/` goes first on PYTHONPATH) and `cwd` the folder that
        relative paths in the command or config refer to there."""
        workdir.mkdir(parents=True, exist_ok=True)
        metrics = workdir / "metrics.jsonl"
        metrics.unlink(missing_ok=True)
        env = dict(os.environ)
        rank_environment(None, self.nproc, env)  # a share of the cores per rank
        env.setdefault("PYTHONFAULTHANDLER", "1")
        if tree is not None:
            paths = [str(p) for p in (tree / "src", cwd) if p is not None and p.is_dir()]
            env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        if self._cfg is None:
            values = {
                "metrics": str(metrics),
                "max_steps": str(self.steps),
                "checkpoint_dir": str(workdir / "checkpoints"),
                "resume": "0",
            }
            argv = script_argv(self.command, values)
            env.update({f"LOCKSTEP_{k.upper()}": v for k, v in values.items()})
        else:
            config = self.config
            if cwd is not None and (cwd / self.config).is_file():
                config = cwd / self.config  # that version's config, where it has one
            overrides = [*self.overrides, f"steps={self.steps}", "checkpoint.resume=never"]
            argv = ["-m", "lockstep", "train", str(Path(config).resolve()), "--out", str(workdir)]
            argv += [a for o in overrides for a in ("--set", o)]
        log = workdir / "run.log"
        monitor: TreeMonitor | None = None

        def watch(pid: int) -> TreeMonitor:
            nonlocal monitor
            monitor = TreeMonitor(pid)
            return monitor

        code = run_command(argv, self.nproc, log, env=env, timeout=self.timeout, cwd=cwd,
                           watch=watch, run_path=self.run_path)  # fmt: skip
        if code is None:
            ranks = ", ".join(sorted(monitor.rss)) or "no rank had started"
            raise RankTimeout(
                f"the job did not finish within {self.timeout:.0f} s and was killed (ranks "
                f"seen: {ranks}); raise --timeout or see {log}"
            )
        if code != 0 and not metrics.is_file():
            raise JobFailed(f"the job exited {code}: {last_error_line(log)} (log: {log})")
        if not metrics.is_file():
            raise UsageError(
                f"the job wrote no metrics to {metrics}; a script must log each step with "
                "lockstep.track.log (LOCKSTEP_METRICS)"
            )
        rows = read_rows(metrics)
        notes = []
        if code != 0:
            notes.append(self._judge_exit(code, log, rows))
            progress(f"lockstep gate: note: {notes[-1]}")
        return Run(
            rows,
            wall_s=monitor.wall_s,
            peak_rss_bytes=dict(monitor.rss),
            gpu_mem_bytes=dict(monitor.gpu),
            log=str(log),
            notes=notes,
        )

    def _judge_exit(self, code: int, log: Path, rows: list[dict]) -> str:
        """A nonzero exit fails the job, except gloo's known abort at interpreter exit after
        every step was logged (`local_ranks.aborted_at_exit`): then the run counts, with a note."""
        logged = {row["step"] for row in rows}
        if aborted_at_exit(log.read_text(errors="replace")) and logged >= set(
            range(1, self.steps + 1)
        ):
            return (
                f"a rank died of SIGABRT at interpreter exit ('{ABORT_SIGNATURE}') after logging "
                f"all {self.steps} steps; counted as finished (log: {log}). End the script with "
                "lockstep.track.finish() to avoid it"
            )
        raise JobFailed(f"the job exited {code}: {last_error_line(log)} (log: {log})")
