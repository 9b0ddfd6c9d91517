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
from dataclasses import dataclass
from pathlib import Path

from lockstep.checks.diagnosis import REPLICA_QUANTITIES, replica_departed
from lockstep.checks.result import CheckResult, tolerance
from lockstep.checks.trajectory import Divergence, by_step, first_divergence, read_metrics
from lockstep.errors import RankTimeout, UsageError
from lockstep.launch.script import Script
from lockstep.track import Protocol


@dataclass(frozen=True)
class Runs:
    """What the checks' runs are asked for: ranks, steps per run, the world sizes compared."""

    nproc: int
    steps: int
    sizes: list[int]


class ScriptRunner:
    """The script's runs for the checks, one per call, each in its own folder: launched by
    `lockstep.launch.script`, a failed launch is bad input (after its triage there), and the
    steps logged past LOCKSTEP_MAX_STEPS are left out with a note."""

    def __init__(
        self,
        command: str,
        workdir: Path,
        timeout: float = 600.0,
        launcher: str = "torchrun",
        run_path: bool = False,
    ):
        self.script = Script(command, launcher=launcher, run_path=run_path, timeout=timeout)
        self.workdir = workdir
        self.timeout = timeout
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
        dtype: str | None = None,
        watch: Path | None = None,
    ) -> list[dict] | dict[int, list[dict]]:
        """One launch; returns the metrics rank 0 wrote (`per_rank`: {rank: metrics}, every
        rank writing its own file). A failed launch is bad input.

        A fresh run (no resume, own checkpoint folder) is reused by later checks asking for
        the same ranks and steps: `check all` launches fewer runs. `reuse=False` forces a new
        launch (determinism needs two).
        """
        key = (nproc, max_steps)
        fresh = checkpoint_dir is None and not resume and not per_rank and dtype is None
        fresh = fresh and watch is None
        if fresh and reuse and key in self._fresh:
            return self._fresh[key]
        run_dir = self.workdir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / ("metrics-{rank}.jsonl" if per_rank else "metrics.jsonl")
        for old in run_dir.glob("metrics*.jsonl"):
            old.unlink()
        checkpoint_dir = checkpoint_dir or run_dir / "checkpoints"
        protocol = Protocol(metrics, max_steps, checkpoint_dir, resume)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        if dtype is not None:  # a replay (`track.replay_dtype`)
            env["LOCKSTEP_DTYPE"] = dtype
        if watch is not None:  # a replay recording modules (`track.watch`)
            env["LOCKSTEP_WATCH"] = str(watch)
        log = run_dir / "run.log"
        self.logs[name] = str(log)
        done = self.script.launch(nproc, protocol, log, env=env)
        if done.code is None:
            raise RankTimeout(
                f"run '{name}' ({nproc} ranks) did not finish within {self.timeout:.0f} s "
                f"and was killed; log: {log}{done.hang_report()}"
            )
        zero_path = protocol.metrics_of(0)
        zero = self._read(name, zero_path, max_steps, None) if zero_path.is_file() else []
        if done.code != 0:
            logged = sorted(by_step(zero))
            note = done.tolerated(logged, max_steps, checkpoint=checkpoint_dir)
            if note is None:
                cause = done.cause(logged, max_steps, checkpoint=checkpoint_dir)
                raise UsageError(f"run '{name}' exited {done.code}: {cause} (log: {log})")
            self.note(f"run '{name}': {note}")
        records: list[dict] | dict[int, list[dict]] = zero
        if per_rank:
            records = {0: zero} | {
                r: self._read(name, protocol.metrics_of(r), max_steps, r) for r in range(1, nproc)
            }
            if not zero_path.is_file():
                self._read(name, zero_path, max_steps, 0)  # raises: names the missing file
        if not per_rank and not zero_path.is_file():
            read_metrics(zero_path)  # raises: names the missing file
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
            return []  # judged by the caller: a crash first, else read_metrics names it
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


def check_determinism(
    runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float
) -> CheckResult:
    nproc, steps = asked.nproc, asked.steps
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
    forensics = _module_replay(runner, div.step, nproc, rtol, atol)
    return CheckResult(
        "determinism",
        False,
        f"two identical runs diverge at {div.describe('run1', 'run2')}",
        divergence=div,
        diagnosis="something is unseeded or nondeterministic: data order, sampling, init, "
        "or a nondeterministic kernel",
        logs=runner.logs,
        notes=runner.take_notes() + forensics["lines"],
        forensics=forensics,
    )


def _read_watched(path: Path) -> list:
    import json

    from lockstep.module_digest import StepRecord

    if not path.is_file():
        return []
    return [StepRecord.from_json(json.loads(line)) for line in path.read_text().splitlines()]


def _module_replay(runner: ScriptRunner, step: int, nproc: int, rtol: float, atol: float):
    """Two more runs to `step` with LOCKSTEP_WATCH set: a script that calls
    `lockstep.track.watch(model)` writes per-module digests, compared here (rank 0's)."""
    from lockstep.checks import divergence as dv

    found = []
    for i in (1, 2):
        path = runner.workdir / f"determinism-watch-{i}" / "modules-{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("modules-*.jsonl"):
            old.unlink()
        runner.run(f"determinism-watch-{i}", nproc=nproc, max_steps=step, watch=path)
        found.append(_read_watched(Path(str(path).replace("{rank}", "0"))))
    if not found[0] or not found[1]:
        line = "no module named: the script does not call lockstep.track.watch(model)"
        return {"parting": None, "verdict": None, "reproduced": None, "lines": [line]}
    parting = dv.first_difference(found[0], found[1], rtol, atol, range(1, step + 1))
    if parting is None:
        line = f"the replay of steps 1..{step} does not reproduce the difference"
    else:
        line = f"first parting: {parting.describe('run1', 'run2')}"
    return {
        "parting": parting.to_dict() if parting else None,
        "verdict": None,
        "reproduced": parting is not None,
        "lines": [line],
    }


def check_resume(runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float) -> CheckResult:
    """2N straight steps against N steps, a checkpoint, new processes and a resume to 2N.

    The script may checkpoint at any step k <= N (every few steps, before or after the step
    of that iteration); the resumed run's first logged step k+1 says where it resumed, and
    steps k+1..2N are compared. A resume that starts at step 1 (nothing loaded), past N+1, or
    that leaves out a step fails.
    """
    nproc, steps = asked.nproc, asked.steps
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


def check_world_size(runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float) -> CheckResult:
    """The same global batch on each world size; the script must keep it constant."""
    sizes, steps = asked.sizes, asked.steps
    runs = {n: runner.run(f"world-size-{n}", nproc=n, max_steps=steps) for n in sizes}
    base = sizes[0]
    _require_steps(runs[base], steps, f"world-size-{base}")
    noise: list[dict] = []  # differences a float64 replay showed to be rounding
    for n in sizes[1:]:
        div = first_divergence(
            runs[base], runs[n], metrics=("loss", "grad_norm"), rtol=rtol, atol=atol
        )
        if div is None:
            continue
        where = div.describe(f"{base}ranks", f"{n}ranks")
        verdict = _float64_replay(runner, div, base, n, (runs[base], runs[n]))
        forensics = {
            "parting": None,
            "verdict": verdict.to_dict(),
            "reproduced": None,
            "lines": [f"float64 replay of step {div.step}: {verdict.text}"],
        }
        if verdict.kind == "noise":
            runner.note(f"{base} and {n} ranks differ at {where}: {verdict.text}")
            noise.append(forensics)
            continue
        diagnosis = "a rank-local computation: clipping or a norm on a local shard, a loss or "
        diagnosis += "batch that depends on the world size, or per-rank randomness"
        if verdict.kind in ("factor", "dependence"):
            diagnosis = f"{verdict.text}; {diagnosis}"
        return CheckResult(
            "world-size",
            False,
            f"{base} and {n} ranks diverge at {where}",
            divergence=div,
            diagnosis=diagnosis,
            logs=runner.logs,
            notes=runner.take_notes(),
            forensics=forensics,
        )
    said = ", apart from rounding noise (float64 replay)" if noise else ""
    return CheckResult(
        "world-size",
        True,
        f"{steps} steps agree on {', '.join(map(str, sizes))} ranks {tolerance(rtol, atol)}{said}",
        logs=runner.logs,
        notes=runner.take_notes(),
        forensics=noise[0] if noise else None,
    )


def _float64_replay(runner: ScriptRunner, div: Divergence, base: int, n: int, fp32=None):
    """Both world sizes again to the diverging step with LOCKSTEP_DTYPE=float64: rounding
    noise shrinks by orders of magnitude, a real dependence does not; loss and gradient norm
    off by one common ratio are named as a normalisation.

    A metric the script keeps in float32 whatever the replay (the HF Trainer's logged loss)
    comes back unchanged: it is judged by the other metric's replay when it differs by no more
    than a few float32 ulps; otherwise the verdict is unavailable."""
    from lockstep.checks import divergence as dv

    if div.metric not in ("loss", "grad_norm") or not isinstance(div.expected, float):
        return dv.Verdict("unavailable", f"no float64 replay for {div.metric}")
    runs = {
        m: by_step(
            runner.run(f"world-size-{m}-float64", nproc=m, max_steps=div.step, dtype="float64")
        )
        for m in (base, n)
    }
    a, b = runs[base].get(div.step, {}), runs[n].get(div.step, {})
    if (a.get(div.metric), b.get(div.metric)) == (div.expected, div.actual):
        other = "grad_norm" if div.metric == "loss" else "loss"
        was = [by_step(r).get(div.step, {}).get(other) for r in fp32 or ({}, {})]
        now = (a.get(other), b.get(other))
        if all(isinstance(x, float) for x in (*was, *now)) and tuple(was) != now:
            judged = dv.float64_verdict(other, tuple(was), now)
            ulps = abs(div.expected - div.actual) / (abs(div.expected) * 2.0**-23)
            if judged.kind == "noise" and ulps <= 4:
                return dv.Verdict(
                    "noise",
                    f"rounding noise: {div.metric} differs by {ulps:.2g} float32 ulp (the "
                    f"script logs it in float32 whatever the replay) and {judged.text}",
                    judged.rel32,
                    judged.rel64,
                )
        return dv.Verdict(
            "unavailable",
            "the float64 replay gave the fp32 values: the script does not follow LOCKSTEP_DTYPE "
            "(call lockstep.track.protocol() before building the model, or use the HF "
            "Trainer's LockstepCallback)",
        )
    verdict = dv.float64_verdict(
        div.metric, (div.expected, div.actual), (a.get(div.metric), b.get(div.metric))
    )
    if verdict.kind == "dependence" and all(
        isinstance(x.get(k), float) and x.get(k) for x in (a, b) for k in ("loss", "grad_norm")
    ):
        ratios = [b[k] / a[k] for k in ("loss", "grad_norm")]
        if abs(ratios[0] - ratios[1]) <= 1e-9 * abs(ratios[0]):
            return dv.Verdict(
                "factor",
                f"a normalisation bug: in a float64 replay the loss and the gradient norm on "
                f"{n} ranks are both {ratios[0]:.6g} times those on {base} (one common factor)",
                verdict.rel32,
                verdict.rel64,
                ratios[0],
            )
    return verdict


def check_replicas(runner: ScriptRunner, asked: Runs) -> CheckResult:
    """One run in which every rank logs its own line: data-parallel replicas must agree after
    every step. Compared exactly, in the order a step computes them: loss, gradient norm,
    parameter digest, buffer digest. A loss that differs per rank from step 1 while
    everything else agrees is taken as each rank's local loss (noted, then left out)."""
    nproc, steps = asked.nproc, asked.steps
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
                        diagnosis=replica_departed(quantity, step, rank),
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


def _require_steps(records: list[dict], steps: int, name: str) -> None:
    logged = sorted(by_step(records))
    if logged != list(range(1, steps + 1)):
        raise UsageError(
            f"run '{name}' logged steps {logged[:3]}..{logged[-3:]}, expected 1..{steps}: "
            "the script must log every optimizer step and stop at LOCKSTEP_MAX_STEPS"
        )
