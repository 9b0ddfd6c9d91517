"""Checks on a user's own training script, run as a black box through torchrun.

The script speaks the protocol of `lockstep.track` (LOCKSTEP_METRICS, LOCKSTEP_MAX_STEPS,
LOCKSTEP_CHECKPOINT_DIR, LOCKSTEP_RESUME; also `{metrics}`, `{max_steps}`,
`{checkpoint_dir}` and `{resume}` placeholders in the command). Each check launches it a few
times and compares the per-step metrics the runs wrote:

- determinism: the same run twice gives identical metrics;
- resume: N steps, a checkpoint, new processes and a resume to 2N match 2N straight steps;
- world-size: the same global batch on 1 and 2 ranks (or more) agrees within tolerance.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.checks.trajectory import Divergence, by_step, first_divergence, read_metrics
from lockstep.errors import RankTimeout, UsageError

PLACEHOLDERS = ("metrics", "max_steps", "checkpoint_dir", "resume")


@dataclass
class CheckResult:
    """What a check found; `passed` decides the exit code (0 or 1)."""

    name: str
    passed: bool
    summary: str
    divergence: Divergence | None = None
    diagnosis: str | None = None
    logs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "check": self.name,
            "passed": self.passed,
            "summary": self.summary,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "diagnosis": self.diagnosis,
            "logs": self.logs,
        }


class ScriptRunner:
    """Launches the script through torchrun, one run per call, each in its own folder."""

    def __init__(self, command: str, workdir: Path, timeout: float = 600.0):
        if not command.strip():
            raise UsageError("--script needs a command, for example --script 'python train.py'")
        self.command = command
        self.workdir = workdir
        self.timeout = timeout
        self.logs: dict[str, str] = {}
        self._fresh: dict[tuple[int, int], list[dict]] = {}

    def run(
        self,
        name: str,
        *,
        nproc: int,
        max_steps: int,
        checkpoint_dir: Path | None = None,
        resume: bool = False,
        reuse: bool = True,
    ) -> list[dict]:
        """One launch; returns the metrics rank 0 wrote. A failed launch is bad input.

        A fresh run (no resume, own checkpoint folder) is reused by later checks asking for
        the same ranks and steps: `check all` launches 5 runs instead of 7. `reuse=False`
        forces a new launch (determinism needs two).
        """
        key = (nproc, max_steps)
        fresh = checkpoint_dir is None and not resume
        if fresh and reuse and key in self._fresh:
            return self._fresh[key]
        run_dir = self.workdir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / "metrics.jsonl"
        metrics.unlink(missing_ok=True)
        checkpoint_dir = checkpoint_dir or run_dir / "checkpoints"
        values = {
            "metrics": str(metrics),
            "max_steps": str(max_steps),
            "checkpoint_dir": str(checkpoint_dir),
            "resume": "1" if resume else "0",
        }
        argv = shlex.split(self.command)
        for i, arg in enumerate(argv):
            for placeholder in PLACEHOLDERS:
                arg = arg.replace("{" + placeholder + "}", values[placeholder])
            argv[i] = arg
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "0",
        ]
        if not argv[0].endswith(".py"):
            launcher.append("--no-python")
        env = dict(os.environ, **{f"LOCKSTEP_{k.upper()}": v for k, v in values.items()})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank killed by a signal logs its stack
        log = run_dir / "run.log"
        self.logs[name] = str(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*launcher, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RankTimeout(
                    f"run '{name}' ({nproc} ranks) did not finish within {self.timeout:.0f} s "
                    f"and was killed; log: {log}"
                ) from None
        if code != 0:
            last = _last_error_line(log)
            raise UsageError(f"run '{name}' exited {code}: {last} (log: {log})")
        records = read_metrics(metrics)
        if fresh:
            self._fresh.setdefault(key, records)
        return records


def _last_error_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["no output"])[-1][:300]


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
            f"two runs of {steps} steps on {nproc} ranks agree {_tol(rtol, atol)}",
            logs=runner.logs,
        )
    return CheckResult(
        "determinism",
        False,
        f"two identical runs diverge at {div.describe('run1', 'run2')}",
        divergence=div,
        diagnosis="something is unseeded or nondeterministic: data order, sampling, init, "
        "or a nondeterministic kernel",
        logs=runner.logs,
    )


def check_resume(
    runner: ScriptRunner, nproc: int, steps: int, rtol: float = 0.0, atol: float = 0.0
) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, new processes and N more steps."""
    half = max(1, steps // 2)
    total = 2 * half
    straight = runner.run("resume-straight", nproc=nproc, max_steps=total)
    ckpt = runner.workdir / "resume-checkpoints"
    runner.run("resume-first-half", nproc=nproc, max_steps=half, checkpoint_dir=ckpt)
    if not ckpt.is_dir() or not any(ckpt.iterdir()):
        raise UsageError(
            f"the script left no checkpoint in LOCKSTEP_CHECKPOINT_DIR ({ckpt}) after "
            f"LOCKSTEP_MAX_STEPS={half}; it must save one when it stops"
        )
    resumed = runner.run(
        "resume-second-half", nproc=nproc, max_steps=total, checkpoint_dir=ckpt, resume=True
    )
    _require_steps(straight, total, "resume-straight")
    logged = sorted(by_step(resumed))
    if not logged or logged[0] != half + 1:
        first = logged[0] if logged else None
        return CheckResult(
            "resume",
            False,
            f"the resumed run logged its first step as {first}, expected {half + 1}",
            diagnosis="the step counter or data position was not restored "
            "(is LOCKSTEP_RESUME=1 honoured?)",
            logs=runner.logs,
        )
    div = first_divergence(
        straight, resumed, steps=range(half + 1, total + 1), rtol=rtol, atol=atol
    )
    if div is None:
        return CheckResult(
            "resume",
            True,
            f"steps {half + 1}..{total} after a resume at step {half} match a "
            f"straight run {_tol(rtol, atol)}",
            logs=runner.logs,
        )
    return CheckResult(
        "resume",
        False,
        f"the resumed run diverges at {div.describe('straight', 'resumed')}",
        divergence=div,
        diagnosis=_diagnose_resume(div, straight, resumed),
        logs=runner.logs,
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
            )
    return CheckResult(
        "world-size",
        True,
        f"{steps} steps agree on {', '.join(map(str, sizes))} ranks {_tol(rtol, atol)}",
        logs=runner.logs,
    )


def _require_steps(records: list[dict], steps: int, name: str) -> None:
    logged = sorted(by_step(records))
    if logged != list(range(1, steps + 1)):
        raise UsageError(
            f"run '{name}' logged steps {logged[:3]}..{logged[-3:]}, expected 1..{steps}: "
            "the script must log every optimizer step and stop at LOCKSTEP_MAX_STEPS"
        )


def _tol(rtol: float, atol: float) -> str:
    return "bitwise" if rtol == atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"
