"""Checks on a user's own training script, run as a black box through torchrun.

The script speaks the protocol of `lockstep.track` (LOCKSTEP_METRICS, LOCKSTEP_MAX_STEPS,
LOCKSTEP_CHECKPOINT_DIR, LOCKSTEP_RESUME; also `{metrics}`, `{max_steps}`,
`{checkpoint_dir}` and `{resume}` placeholders in the command). Each check launches it a few
times and compares the per-step metrics the runs wrote:

- determinism: the same run twice gives identical metrics;
- resume: N steps, a checkpoint, new processes and a resume to 2N match 2N straight steps;
  the resumed run may start at any step k+1 <= N+1 after a checkpoint at k (periodic
  checkpoints), the first step it logs says where;
- world-size: the same global batch on 1 and 2 ranks (or more) agrees within tolerance;
- replicas: one run in which every rank logs its own line (`{rank}` in LOCKSTEP_METRICS):
  every rank's loss, gradient norm and parameter/buffer digests agree with rank 0's.

Tolerated, with a one-line note: steps logged past LOCKSTEP_MAX_STEPS (loops that overshoot
by one) are ignored; the known gloo abort at interpreter exit (SIGABRT, "terminate called
without an active exception", no Python frame) after a complete run that left its
checkpoint. Any other crash is bad input.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from lockstep.checks.result import CheckResult, tolerance
from lockstep.checks.trajectory import Divergence, by_step, first_divergence, read_metrics
from lockstep.errors import RankTimeout, UsageError
from lockstep.launch import (
    ABORT_SIGNATURE,
    aborted_at_exit,
    free_port,
    last_error_line,
    run_command,
    run_launcher,
)

PLACEHOLDERS = ("metrics", "max_steps", "checkpoint_dir", "resume")
LAUNCHERS = ("torchrun", "deepspeed")
REPLICA_QUANTITIES = ("loss", "grad_norm", "param_digest", "buffer_digest")


class ScriptRunner:
    """Launches the script through torchrun's launcher API (or the deepspeed launcher), one
    run per call, each in its own folder."""

    def __init__(
        self,
        command: str,
        workdir: Path,
        timeout: float = 600.0,
        launcher: str = "torchrun",
        run_path: bool = False,
    ):
        if not command.strip():
            raise UsageError("--script needs a command, for example --script 'python train.py'")
        if launcher not in LAUNCHERS:
            raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        if run_path and launcher != "torchrun":
            raise UsageError("--run-path is torchrun's: drop it or --launcher deepspeed")
        if launcher == "deepspeed":
            from lockstep import extras

            extras.require("--launcher deepspeed", {"deepspeed": "its launcher"})
        self.run_path = run_path
        self.command = command
        self.workdir = workdir
        self.timeout = timeout
        self.launcher = launcher
        self.logs: dict[str, str] = {}
        self.notes: list[str] = []
        self.last_logged: dict[str, int] = {}  # per run: its last step, overshoot included
        self._fresh: dict[tuple[int, int], list[dict]] = {}

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.notes.append(text)

    def _launch(self, nproc: int, argv: list[str], log: Path, env: dict) -> int | None:
        """Start `argv` on `nproc` local ranks: through torchrun's launcher API in this
        process, or the deepspeed launcher's command; its exit code, None on a timeout."""
        if self.launcher == "torchrun":
            return run_command(
                argv, nproc, log, env=env, timeout=self.timeout, run_path=self.run_path
            )
        if not argv[0].endswith(".py"):
            raise UsageError("--launcher deepspeed runs a Python script: --script 'train.py ...'")
        command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc),
                   "--master_port", str(free_port()), *argv]  # fmt: skip
        return run_launcher(command, log, env=env, timeout=self.timeout)

    def run(
        self,
        name: str,
        *,
        nproc: int,
        max_steps: int,
        checkpoint_dir: Path | None = None,
        resume: bool = False,
        reuse: bool = True,
        per_rank: bool = False,
    ) -> list[dict] | dict[int, list[dict]]:
        """One launch; returns the metrics rank 0 wrote (`per_rank`: {rank: metrics}, every
        rank writing its own file). A failed launch is bad input.

        A fresh run (no resume, own checkpoint folder) is reused by later checks asking for
        the same ranks and steps: `check all` launches fewer runs. `reuse=False` forces a new
        launch (determinism needs two).
        """
        key = (nproc, max_steps)
        fresh = checkpoint_dir is None and not resume and not per_rank
        if fresh and reuse and key in self._fresh:
            return self._fresh[key]
        run_dir = self.workdir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / ("metrics-{rank}.jsonl" if per_rank else "metrics.jsonl")
        for old in run_dir.glob("metrics*.jsonl"):
            old.unlink()
        checkpoint_dir = checkpoint_dir or run_dir / "checkpoints"
        values = {
            "metrics": str(metrics),
            "max_steps": str(max_steps),
            "checkpoint_dir": str(checkpoint_dir),
            "resume": "1" if resume else "0",
        }
        argv = script_argv(self.command, values)
        env = dict(os.environ, **{f"LOCKSTEP_{k.upper()}": v for k, v in values.items()})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank killed by a signal logs its stack
        log = run_dir / "run.log"
        self.logs[name] = str(log)
        started = time.time()
        code = self._launch(nproc, argv, log, env)
        if code is None:
            raise RankTimeout(
                f"run '{name}' ({nproc} ranks) did not finish within {self.timeout:.0f} s "
                f"and was killed; log: {log}"
            )

        def path_of(rank: int) -> Path:
            return Path(str(metrics).replace("{rank}", str(rank)))

        zero_path = path_of(0) if per_rank else metrics
        zero = self._read(name, zero_path, max_steps, None) if zero_path.is_file() else []
        if code != 0:
            self._judge_failure(name, code, log, zero, max_steps, checkpoint_dir, started)
        records: list[dict] | dict[int, list[dict]] = zero
        if per_rank:
            records = {0: zero} | {
                r: self._read(name, path_of(r), max_steps, r) for r in range(1, nproc)
            }
            if not zero_path.is_file():
                self._read(name, zero_path, max_steps, 0)  # raises: names the missing file
        if not per_rank and not metrics.is_file():
            read_metrics(metrics)  # raises: names the missing file
        if fresh:
            self._fresh.setdefault(key, records)
        return records

    def _read(self, name: str, path: Path, max_steps: int, rank: int | None) -> list[dict]:
        """A run's records, without the steps past LOCKSTEP_MAX_STEPS (noted once)."""
        if rank is not None and not path.is_file():
            raise UsageError(
                f"run '{name}': rank {rank} wrote no metrics at {path}; with '{{rank}}' in "
                "LOCKSTEP_METRICS every rank must call lockstep.track.log(step, ..., model=model)"
            )
        if not path.is_file():
            return []  # judged below: a crash first, else read_metrics names the missing file
        records = read_metrics(path)
        if rank in (None, 0) and records:
            self.last_logged[name] = max(int(r["step"]) for r in records)
        over = sorted({int(r["step"]) for r in records if int(r["step"]) > max_steps})
        if over:
            if rank in (None, 0):
                self.note(
                    f"run '{name}' logged step {over[0]}"
                    + (f"..{over[-1]}" if len(over) > 1 else "")
                    + f" past LOCKSTEP_MAX_STEPS={max_steps}; ignored"
                )
            records = [r for r in records if int(r["step"]) <= max_steps]
        return records

    def _judge_failure(
        self, name, code, log: Path, records, max_steps, checkpoint_dir: Path, started
    ) -> None:
        """A nonzero exit is bad input, except the known gloo abort at interpreter exit after
        a run that logged every step and wrote its checkpoint: then a note, and go on."""
        text = log.read_text(errors="replace")
        logged = sorted(by_step(records))
        complete = bool(logged) and logged == list(range(logged[0], max_steps + 1))
        at_exit = aborted_at_exit(text)
        if at_exit and complete and _fresh_checkpoint(checkpoint_dir, started):
            self.note(
                f"run '{name}': a rank died of SIGABRT at interpreter exit ('{ABORT_SIGNATURE}',"
                " a gloo worker thread stopped by Python's finalization) after logging every "
                "step and writing its checkpoint; counted as finished. End the script with "
                "lockstep.track.finish() to avoid it"
            )
            return
        last = last_error_line(log)
        other = other_python(script_argv(self.command, {p: "" for p in PLACEHOLDERS}))
        if other and "No module named" in last:
            raise UsageError(
                f"run '{name}' exited {code}: {last}: the `{os.path.basename(other)}` on PATH "
                f"({other}) is not the interpreter running lockstep ({sys.executable}): "
                "activate its venv, or write the script command with that path "
                f"(--script '{sys.executable} ...') (log: {log})"
            )
        if ABORT_SIGNATURE in text:
            why = "at interpreter exit" if at_exit else "while the script was running"
            missing = (
                f"it logged steps {_span(logged)} of 1..{max_steps}"
                if not complete
                else "it left no complete checkpoint"
            )
            last = f"a rank died of SIGABRT ('{ABORT_SIGNATURE}') {why}; {missing}"
        raise UsageError(f"run '{name}' exited {code}: {last} (log: {log})")


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


def _fresh_checkpoint(folder: Path, since: float) -> bool:
    """A checkpoint this run wrote: a file in the folder, none empty, one written after the
    launch started (a resumed run's old checkpoint does not count)."""
    if not folder.is_dir():
        return False
    files = [p for p in folder.rglob("*") if p.is_file()]
    return (
        bool(files)
        and all(p.stat().st_size > 0 for p in files)
        and any(p.stat().st_mtime >= since - 1 for p in files)
    )


PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def other_python(argv: list[str], path: str | None = None) -> str | None:
    """The interpreter a command run as `python ...` (or python3, python3.11) finds on PATH
    (`path`, default this process's), when it is not the one running lockstep (another venv,
    or the system's, without torch or lockstep); None when it is, or for any other command."""
    if not argv or not PYTHON_NAME.fullmatch(argv[0]):
        return None
    found = shutil.which(argv[0], path=path if path is not None else os.environ.get("PATH"))
    if found is None or _prefix(found) == _prefix(sys.executable):
        return None
    return found


def _prefix(executable: str) -> str:
    """The environment an interpreter runs in, as its startup finds it: a venv's folder (a
    pyvenv.cfg beside it or one level up, before any symlink is followed; a venv's python is
    a symlink to its base interpreter), else the installation the resolved binary is in."""
    here = os.path.dirname(os.path.abspath(executable))
    for folder in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return os.path.realpath(folder)
    return os.path.dirname(os.path.dirname(os.path.realpath(executable)))


def script_argv(command: str, values: dict[str, str]) -> list[str]:
    """The script's command line with the protocol's placeholders (`{max_steps}`, ...) filled."""
    argv = shlex.split(command)
    for i, arg in enumerate(argv):
        for placeholder in PLACEHOLDERS:
            arg = arg.replace("{" + placeholder + "}", values[placeholder])
        argv[i] = arg
    return argv


def check_determinism(
    runner: ScriptRunner, nproc: int, steps: int, rtol: float = 0.0, atol: float = 0.0
) -> CheckResult:
    first = runner.run("determinism-1", nproc=nproc, max_steps=steps)
    second = runner.run("determinism-2", nproc=nproc, max_steps=steps, reuse=False)
    _require_steps(first, steps, "determinism-1")
    div = first_divergence(first, second, rtol=rtol, atol=atol)
    if div is None:
        return CheckResult(
            "determinism",
            True,
            f"two runs of {steps} steps on {nproc} ranks agree {tolerance(rtol, atol)}",
            logs=runner.logs,
            notes=runner.take_notes(),
        )
    return CheckResult(
        "determinism",
        False,
        f"two identical runs diverge at {div.describe('run1', 'run2')}",
        divergence=div,
        diagnosis="something is unseeded or nondeterministic: data order, sampling, init, "
        "or a nondeterministic kernel",
        logs=runner.logs,
        notes=runner.take_notes(),
    )


def check_resume(
    runner: ScriptRunner, nproc: int, steps: int, rtol: float = 0.0, atol: float = 0.0
) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, new processes and a resume to 2N.

    The script may checkpoint at any step k <= N (every few steps, before or after the step
    of that iteration); the resumed run's first logged step k+1 says where it resumed, and
    steps k+1..2N are compared. A resume that starts at step 1 (nothing loaded), past N+1, or
    that leaves out a step fails.
    """
    half = max(1, steps // 2)
    total = 2 * half
    straight = runner.run("resume-straight", nproc=nproc, max_steps=total)
    ckpt = runner.workdir / "resume-checkpoints"
    runner.run("resume-first-half", nproc=nproc, max_steps=half, checkpoint_dir=ckpt)
    if not ckpt.is_dir() or not any(ckpt.iterdir()):
        raise UsageError(
            f"the script left no checkpoint in LOCKSTEP_CHECKPOINT_DIR ({ckpt}) within "
            f"LOCKSTEP_MAX_STEPS={half} steps; it must save one at or before its last step"
        )
    resumed = runner.run(
        "resume-second-half", nproc=nproc, max_steps=total, checkpoint_dir=ckpt, resume=True
    )
    _require_steps(straight, total, "resume-straight")
    logged = sorted(by_step(resumed))

    def fail(summary: str, diagnosis: str, div: Divergence | None = None) -> CheckResult:
        return CheckResult("resume", False, summary, divergence=div, diagnosis=diagnosis,
                           logs=runner.logs, notes=runner.take_notes())  # fmt: skip

    if not logged:
        return fail("the resumed run logged no step", "the resumed run did not train")
    first = logged[0]
    if first == 1:
        return fail(
            f"the resumed run started again at step 1 (the first run stopped at {half})",
            "no checkpoint was loaded: is LOCKSTEP_RESUME=1 honoured, and does the step "
            "counter come from the checkpoint?",
            Divergence(1, "step", None, 1),
        )
    stopped = max(half, runner.last_logged.get("resume-first-half", half))  # overshoot
    if first > stopped + 1:
        return fail(
            f"the resumed run starts at step {first}, after the first run's last step "
            f"{stopped}: "
            + (
                f"step {first - 1} was skipped"
                if first - 1 == stopped + 1
                else f"steps {stopped + 1}..{first - 1} were skipped"
            ),
            "the step counter or data position restored past the checkpoint "
            "(an off-by-one when saving or loading the step?)",
            Divergence(stopped + 1, "step", stopped + 1, None),
        )
    gaps = sorted(set(range(first, total + 1)) - set(logged))
    if gaps:
        return fail(
            f"the resumed run (from step {first}) skipped step {gaps[0]}",
            "the resumed run left out a step: the step counter advances twice, or a step "
            "is not logged",
            Divergence(gaps[0], "step", gaps[0], None),
        )
    where = f"a resume at step {first - 1}"
    if first - 1 < half:
        where += f" (its latest checkpoint; the first run stopped at {half})"
    elif first - 1 > half:
        where += f" (the first run went past LOCKSTEP_MAX_STEPS={half})"
    div = first_divergence(straight, resumed, steps=range(first, total + 1), rtol=rtol, atol=atol)
    if div is None:
        return CheckResult(
            "resume",
            True,
            f"steps {first}..{total} after {where} match a straight run {tolerance(rtol, atol)}",
            logs=runner.logs,
            notes=runner.take_notes(),
        )
    return fail(
        f"the resumed run diverges at {div.describe('straight', 'resumed')}",
        _diagnose_resume(div, straight, resumed),
        div,
    )


def _diagnose_resume(div: Divergence, straight: list[dict], resumed: list[dict]) -> str:
    """Name the state that a resume most likely lost, from what the metrics show."""
    compared = range(div.step, max(by_step(straight)) + 1)
    if first_divergence(straight, resumed, metrics=("lr",), steps=compared) is not None:
        return "the LR schedule was not restored"
    if div.step == min(by_step(resumed)):
        return (
            "the first step after the resume already differs while the LR matches: "
            "parameters, optimizer state, RNG state or data position were not restored"
        )
    return (
        f"the runs agree after the resume and drift from step {div.step}: optimizer or "
        "RNG state was not fully restored"
    )


def check_world_size(
    runner: ScriptRunner, sizes: list[int], steps: int, rtol: float = 1e-4, atol: float = 1e-6
) -> CheckResult:
    """The same global batch on each world size; the script must keep it constant."""
    runs = {n: runner.run(f"world-size-{n}", nproc=n, max_steps=steps) for n in sizes}
    base = sizes[0]
    _require_steps(runs[base], steps, f"world-size-{base}")
    for n in sizes[1:]:
        div = first_divergence(
            runs[base], runs[n], metrics=("loss", "grad_norm"), rtol=rtol, atol=atol
        )
        if div is not None:
            return CheckResult(
                "world-size",
                False,
                f"{base} and {n} ranks diverge at {div.describe(f'{base}ranks', f'{n}ranks')}",
                divergence=div,
                diagnosis="a rank-local computation: clipping or a norm on a local shard, "
                "a loss or batch that depends on the world size, or per-rank randomness",
                logs=runner.logs,
                notes=runner.take_notes(),
            )
    return CheckResult(
        "world-size",
        True,
        f"{steps} steps agree on {', '.join(map(str, sizes))} ranks {tolerance(rtol, atol)}",
        logs=runner.logs,
        notes=runner.take_notes(),
    )


def check_replicas(runner: ScriptRunner, nproc: int, steps: int) -> CheckResult:
    """One run in which every rank logs its own line: data-parallel replicas must agree after
    every step. Compared exactly, in the order a step computes them: loss, gradient norm,
    parameter digest, buffer digest. A loss that differs per rank from step 1 while
    everything else agrees is taken as each rank's local loss (noted, then left out)."""
    if nproc < 2:
        raise UsageError("the replicas check compares ranks: run it with --nproc 2 or more")
    per_rank = runner.run("replicas", nproc=nproc, max_steps=steps, per_rank=True)
    runs = {r: by_step(records) for r, records in per_rank.items()}
    _require_steps(per_rank[0], steps, "replicas")
    present = [q for q in REPLICA_QUANTITIES if q in runs[0][1]]
    if not {"param_digest", "buffer_digest"} & set(present):
        runner.note("no parameter digest logged: pass model=model to lockstep.track.log")
    if "loss" in present and _local_loss(runs, present):
        runner.note("the logged loss differs per rank from step 1 while the replicas agree: "
                    "each rank logs its local loss; losses left out of the comparison")  # fmt: skip
        present.remove("loss")
    for step in range(1, steps + 1):
        for quantity in present:
            want = runs[0][step].get(quantity)
            for rank in range(1, nproc):
                got = runs[rank].get(step, {}).get(quantity)
                if got != want:
                    div = Divergence(step, quantity, want, got)
                    return CheckResult(
                        "replicas",
                        False,
                        f"rank {rank} departed from rank 0 at step {step}: {quantity} "
                        f"rank0={want!r} rank{rank}={got!r}",
                        divergence=div,
                        diagnosis=_diagnose_replica(quantity, step, runs, rank),
                        logs=runner.logs,
                        notes=runner.take_notes(),
                        rank=rank,
                    )
    return CheckResult(
        "replicas",
        True,
        f"{nproc} ranks hold identical replicas ({', '.join(present)}) after each of {steps} steps",
        logs=runner.logs,
        notes=runner.take_notes(),
    )


def _local_loss(runs: dict[int, dict[int, dict]], present: list[str]) -> bool:
    """The loss differs at step 1 while every other quantity agrees at every step."""
    if all(run.get(1, {}).get("loss") == runs[0][1]["loss"] for run in runs.values()):
        return False
    others = [q for q in present if q != "loss"]
    return bool(others) and all(
        run.get(step, {}).get(q) == record.get(q)
        for run in runs.values()
        for step, record in runs[0].items()
        for q in others
    )


def _diagnose_replica(quantity: str, step: int, runs, rank: int) -> str:
    if quantity == "buffer_digest":
        return (
            f"rank {rank}'s buffers differ from rank 0's while its parameters agree: a buffer "
            "updated from the local batch and never broadcast or averaged (BatchNorm running "
            "statistics: use SyncBatchNorm, or DDP's broadcast_buffers)"
        )
    if quantity == "grad_norm":
        return (
            f"rank {rank}'s gradient norm differs: a gradient that is not averaged over ranks "
            "(a parameter left out of the all-reduce) or a norm computed on a local shard"
        )
    if quantity == "param_digest":
        if step == 1:
            return (
                f"rank {rank}'s parameters differ after step 1 although the averaged gradients "
                "agree: the replicas started from different weights (a rank-dependent seed, "
                "e.g. for dropout or augmentation, set before the model is built, and no "
                "broadcast of the initial parameters)"
            )
        return (
            f"rank {rank}'s parameters departed although the gradient norms agree: an update "
            "that uses rank-local state (optimizer state, a rank-dependent step)"
        )
    return (
        f"rank {rank}'s loss differs while the replicas agreed before the step: its forward "
        "pass saw different inputs or randomness (rank-dependent dropout or augmentation "
        "applied to data every rank shares)"
    )


def _require_steps(records: list[dict], steps: int, name: str) -> None:
    logged = sorted(by_step(records))
    if logged != list(range(1, steps + 1)):
        raise UsageError(
            f"run '{name}' logged steps {logged[:3]}..{logged[-3:]}, expected 1..{steps}: "
            "the script must log every optimizer step and stop at LOCKSTEP_MAX_STEPS"
        )
