"""The job a gate runs, defined and run: the reference training (`lockstep train` CONFIG) or a
user's script, one launch per run in its own folder. Design: docs/design/gates.md."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.errors import EXIT_FAIL, LockstepError, RankTimeout, UsageError
from lockstep.gate.monitor import TreeMonitor
from lockstep.gate.policy import SCRIPT_STEPS
from lockstep.gate.run_result import Run, read_rows
from lockstep.job_options import NPROC, TIMEOUT_S
from lockstep.launch import rank_environment
from lockstep.launch.progress import watching
from lockstep.launch.protocol_run import LOG, METRICS, ProtocolRun, run_under_protocol
from lockstep.launch.script import Script, dumps_folder, launch
from lockstep.redact import scrub_text
from lockstep.reference_job import ReferenceJob
from lockstep.reference_job import load as load_reference
from lockstep.track import Protocol


class JobFailed(LockstepError):
    """The job exited non-zero (exit 1: the job, not the input, failed); the message has its
    last error line and its log."""

    exit_code = EXIT_FAIL


@dataclass
class Job:
    nproc: int = NPROC
    steps: int | None = None
    config: Path | None = None
    overrides: list[str] = field(default_factory=list)
    command: str | None = None
    timeout: float = TIMEOUT_S
    run_path: bool = False  # ranks forked from a process that imported torch (lockstep.launch)

    def __post_init__(self) -> None:
        if (self.config is None) == (self.command is None):
            raise UsageError("give the job as a CONFIG file or as --script 'CMD', not both")
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc}: need at least 1")
        if self.steps is not None and self.steps < 2:
            raise UsageError(f"--steps {self.steps}: a gate needs at least 2 steps")
        self._script = None
        if self.command is not None:
            self._script = Script(self.command, run_path=self.run_path, timeout=self.timeout)
        self._reference: ReferenceJob | None = None
        if self.config is not None:
            self._reference = load_reference(self.config, self.overrides, self.nproc, self.steps)
            self.steps = self._reference.steps
        elif self.overrides:
            raise UsageError("--set applies to a CONFIG job; a script takes its settings itself")
        else:
            self.steps = self.steps or SCRIPT_STEPS

    # ------------------------------------------------------------------ what it is

    def settings(self) -> dict:
        """The job's own key fields (`envkey.environment`)."""
        if self._reference is None:
            deepspeed = "deepspeed" in " ".join([self.command, *self._sources()]).lower()
            return {"engine": "script", "world_size": self.nproc, "deepspeed": deepspeed}
        return self._reference.settings()

    def _sources(self) -> list[str]:
        """The text of the .py files the command names (what its digest covers too)."""
        return [source.decode(errors="replace") for source in self._script_files()]

    def _script_files(self) -> list[bytes]:
        """The bytes of each .py file the command names, read bounded (`inputs.read_bytes`)."""
        from lockstep.inputs import read_bytes

        return [
            read_bytes(arg, "script file")
            for arg in shlex.split(self.command)
            if arg.endswith(".py") and Path(arg).is_file()
        ]

    def require_extras(self, what: str) -> None:
        """A CONFIG job's missing extras, in one line before any run (`lockstep.extras`)."""
        if self._reference is not None:
            self._reference.require_extras(f"{what} {self.config}")

    def describe(self) -> dict:
        how = {"run_path": True} if self.run_path else {}
        if self._reference is None:
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
        if self._reference is not None:
            h.update(self._reference.resolved().encode())
        else:
            h.update(self.command.encode())
            for source in self._script_files():
                h.update(source)
        return "sha256:" + h.hexdigest()

    def arguments(self) -> str:
        """The job's part of a `lockstep gate` command line, for the commands we print."""
        if self._reference is None:
            parts = ["--script", shlex.quote(scrub_text(self.command))]
        else:
            parts = [shlex.quote(str(self.config))]
            # scrubbed: printed and written to reports (the user puts a secret back)
            parts += [f"--set {shlex.quote(scrub_text(o))}" for o in self.overrides]
        parts += [f"--nproc {self.nproc}", f"--steps {self.steps}"]
        return " ".join(parts + (["--run-path"] if self.run_path else []))

    # ------------------------------------------------------------------ running it

    def run(
        self, workdir: Path, tree: Path | None = None, cwd: Path | None = None, progress=print
    ) -> Run:
        """One launch in `workdir`, emptied first. For another version of the code, `tree` is
        its repository root and `cwd` the folder relative paths refer to there."""
        fresh_folder(workdir, progress)
        env = dict(os.environ)
        rank_environment(None, self.nproc, env)  # a share of the cores per rank
        env.setdefault("PYTHONFAULTHANDLER", "1")
        if tree is not None:
            paths = [str(p) for p in (tree / "src", cwd) if p is not None and p.is_dir()]
            env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        monitor: TreeMonitor | None = None

        def watch(pid: int) -> TreeMonitor:
            nonlocal monitor
            monitor = TreeMonitor(pid)
            return monitor

        if self._script is not None:
            run = run_under_protocol(self._script, self.nproc, workdir, max_steps=self.steps,
                                     env=env, cwd=cwd, watch=watch)  # fmt: skip
        else:
            run = self._run_reference(workdir, env, cwd, watch)
        if run.timed_out:
            ranks = ", ".join(sorted(monitor.rss)) or "no rank had started"
            raise RankTimeout(
                f"the job did not finish within {self.timeout:.0f} s and was killed (ranks "
                f"seen: {ranks}); raise --timeout or see {run.log}{run.exit.hang_report()}"
            )
        rows, notes = self._read(run, progress)
        return Run(
            rows,
            wall_s=monitor.wall_s,
            peak_rss_bytes=dict(monitor.rss),
            gpu_mem_bytes=dict(monitor.gpu),
            log=str(run.log),
            notes=notes,
        )

    def _run_reference(self, workdir: Path, env: dict, cwd: Path | None, watch) -> ProtocolRun:
        """The reference job launched as `-m lockstep train`, its metrics in `workdir`."""
        workdir.mkdir(parents=True, exist_ok=True)
        metrics = workdir / METRICS
        metrics.unlink(missing_ok=True)
        log = workdir / LOG
        extra = (f"steps={self.steps}", "checkpoint.resume=never")
        argv = self._reference.argv(workdir, cwd, extra)
        with watching(workdir.name, metrics, self.steps):
            done = launch(argv, self.nproc, log, env=env,
                          timeout=self.timeout, run_path=self.run_path, cwd=cwd,
                          watch=watch, forensics=dumps_folder(log))  # fmt: skip
        return ProtocolRun(Protocol(metrics, self.steps, None, resume=False), done)

    def _read(self, run: ProtocolRun, progress) -> tuple[list[dict], list[str]]:
        """The run's rows and notes: a crash is a failed job (but the gloo abort at exit after
        every step: a note), no metrics at all bad input."""
        metrics = run.metrics_of(0)
        notes: list[str] = []
        if run.code != 0 and not metrics.is_file():
            raise JobFailed(f"the job exited {run.code}: {run.crash([], first=1).cause} "
                            f"(log: {run.log})")  # fmt: skip
        if not metrics.is_file():
            raise UsageError(
                f"the job wrote no metrics to {metrics}; a script must log each step with "
                "lockstep.track.log (LOCKSTEP_METRICS)"
            )
        rows = read_rows(metrics)
        crash = run.crash([row["step"] for row in rows], first=1)
        if crash is not None and crash.cause is not None:
            raise JobFailed(f"the job exited {run.code}: {crash.cause} (log: {run.log})")
        if crash is not None:
            notes.append(crash.note)
            progress(f"lockstep gate: note: {crash.note}")
        return rows, notes


def fresh_folder(folder: Path, progress) -> None:
    """Empty a previous run's folder (it holds `run.log`) before a launch, so no script resumes
    its checkpoint; any other folder with something in it is bad input."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    if not (folder / LOG).is_file():
        raise UsageError(
            f"{folder} holds files that are not a previous gate run's; give --workdir an "
            "empty or new folder (the gate runs each job in a fresh one)"
        )
    shutil.rmtree(folder)
    progress(
        f"lockstep gate: removed the previous run in {folder} (its checkpoints would be resumed)"
    )
