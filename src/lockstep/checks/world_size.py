"""The world-size check: the same global batch trains alike on any number of ranks; a difference
is judged by a float64 replay and the noise floor. Design: docs/design/checks.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lockstep import local_batch
from lockstep.checks import divergence as dv
from lockstep.checks import noise_floor as nf
from lockstep.checks import registry
from lockstep.checks.agreement import agree, combine
from lockstep.checks.divergence_replay import reference_side, trainer_side
from lockstep.checks.harness import fresh_trajectory, trajectory, without_checkpoints, world_size
from lockstep.checks.reference import run_reference
from lockstep.checks.result import CheckResult, skipped_notes, tolerance
from lockstep.checks.script_runs import Runs, ScriptRunner, require_steps
from lockstep.checks.trajectory import Divergence, by_step, first_divergence
from lockstep.errors import RankTimeout, UsageError
from lockstep.train.config import RunConfig

RANK_LOCAL = (
    "a rank-local computation: clipping or a norm on a local shard, a loss or batch that "
    "depends on the world size, or per-rank randomness"
)


def check_world_size(cfg: RunConfig, workdir: Path) -> CheckResult:
    """This world size against the unsharded reference, dropout and local-batch BatchNorm
    switched off; what cannot be leaves a difference not judged."""
    n = world_size()
    with local_batch.watching(neutralise=True) as watch:
        ref = run_reference(cfg, n)
        out = workdir / f"world-size-{n}"
        # a run shared from another check of this launch ran unwatched
        ranks = trajectory(cfg, out) if not watch.found else fresh_trajectory(cfg, out)
        result = agree(
            "world-size",
            {"1 process (unsharded)": (ref.steps, ref.params), f"{n} ranks": ranks},
            cfg,
            "a rank-local computation: a norm or loss on a local shard, a batch that depends "
            "on the world size, or per-rank randomness",
            sides={
                "1 process (unsharded)": reference_side(cfg, n),
                f"{n} ranks": trainer_side(without_checkpoints(cfg)),
            },
            workdir=workdir,
            passes=("backward", "update"),  # the ranks' forward sees part of the batch
        )
    left = [key for key, done in watch.found.items() if not done]
    if left and result.verdict == "fail":
        result.judged = False
        result.summary = (
            f"not judged: {result.summary}; {local_batch.describe(left)} normalises over the "
            "local batch with no running statistics to use instead: SyncBatchNorm on GPUs, or "
            "a per-sample norm, would make it judgeable"
        )
    elif watch.found:
        result.notes.append(f"judged with {local_batch.describe(watch.found)} switched off")
    return result


def plan(launches, check: registry.Check) -> list[CheckResult]:
    """One launch per world size, on the same global batch; one result for all."""
    for n in launches.sizes:
        launches.fixed.check(n)
    found = [
        r for n in launches.sizes for r in launches.ranks([check.rank], n, launches.fixed_config)
    ]
    return [combine(check.name, found)]


# ------------------------------------------------------------------------------ a script


def check_script(runner: ScriptRunner, asked: Runs, *, rtol: float, atol: float) -> CheckResult:
    """The script on each world size, again without dropout and local-batch BatchNorm where
    the runs differ."""
    runs = _runs(runner, asked)
    if isinstance(runs, CheckResult):
        return runs
    found = _found(runs)
    if not found or _agree(runs, asked, rtol, atol):
        return _compare(runner, runs, asked, rtol, atol, found)
    neutral = _Neutralised(runner)
    runs = _runs(neutral, asked)
    if isinstance(runs, CheckResult):
        return runs
    left = _not_neutralised(runs)
    if left and not _agree(runs, asked, rtol, atol):
        return CheckResult(
            "world-size",
            False,
            f"not judged: the runs on {', '.join(map(str, asked.sizes))} ranks differ, and the "
            f"model's result depends on the world size by design ({left})",
            logs=runner.logs,
            notes=runner.take_notes(),
            judged=False,
        )
    result = _compare(neutral, runs, asked, rtol, atol, _found(runs))
    runner.note(f"judged with {local_batch.describe(_found(runs))} switched off for the "
                "check's runs (they make the result depend on the world size by design)")  # fmt: skip
    result.notes = runner.take_notes() + result.notes
    return result


class _Neutralised:
    """The runner, each run made with dropout and local-batch BatchNorm switched off."""

    def __init__(self, runner: ScriptRunner):
        self.runner = runner

    def run(self, name: str, **kwargs):
        variables = {local_batch.MODE: "neutralise"}
        return self.runner.run(f"{name}-neutralised", variables=variables, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.runner, name)


def _runs(runner, asked: Runs) -> dict[int, list[dict]] | CheckResult:
    """One run per world size, each sound (else the failure)."""
    sizes, steps = asked.sizes, asked.steps
    runs = {n: runner.run(f"world-size-{n}", nproc=n, max_steps=steps) for n in sizes}
    require_steps(runs[sizes[0]], steps, f"world-size-{sizes[0]}")
    bad = runner.unsound("world-size", {f"world-size-{n}": runs[n] for n in sizes})
    return bad if bad is not None else runs


def _found(runs: dict[int, list[dict]]) -> dict[tuple[str, str], bool]:
    found: dict[tuple[str, str], bool] = {}
    for records in runs.values():
        for key, done in local_batch.findings(records)[0].items():
            found[key] = found.get(key, True) and done
    return found


def _not_neutralised(runs: dict[int, list[dict]]) -> str:
    """What the neutralised runs could not switch off, and what would make it judgeable."""
    found = _found(runs)
    left = [key for key, done in found.items() if not done]
    late = any(local_batch.findings(records)[1] != 1 for records in runs.values())
    why = []
    if any(kind == local_batch.BATCHNORM for kind, _ in left):
        why.append(
            f"{local_batch.describe(left)} normalises over the local batch with no running "
            "statistics to use instead (track_running_stats=False): SyncBatchNorm on GPUs, or a "
            "per-sample norm (GroupNorm, LayerNorm), would make it judgeable"
        )
    elif left:
        why.append(f"{local_batch.describe(left)} could not be switched off")
    if late:
        why.append(
            f"{local_batch.describe(found)} ran before lockstep could switch it off: call "
            "lockstep.track.protocol() before the model's first forward"
        )
    return "; ".join(why)


def _agree(runs: dict[int, list[dict]], asked: Runs, rtol: float, atol: float) -> bool:
    base = asked.sizes[0]
    return all(
        first_divergence(runs[base], runs[n], metrics=("loss", "grad_norm"), rtol=rtol,
                         atol=atol) is None
        for n in asked.sizes[1:]
    )  # fmt: skip


def _compare(runner, runs: dict[int, list[dict]], asked: Runs, rtol: float, atol: float,
             found: dict[tuple[str, str], bool]) -> CheckResult:  # fmt: skip
    """The world sizes' runs against the first (`judge_difference`)."""
    sizes, steps = asked.sizes, asked.steps
    base = sizes[0]
    logged = {f"world-size-{n}": runs[n] for n in sizes}
    noise: list[dict] = []
    said = ""
    for n in sizes[1:]:
        div = first_divergence(
            runs[base], runs[n], metrics=("loss", "grad_norm"), rtol=rtol, atol=atol
        )
        if div is None:
            continue
        where = div.describe(f"{base}ranks", f"{n}ranks")
        verdict, why, forensics = judge_difference(runner, div, (base, n), runs, steps, rtol, atol)
        if verdict == "pass":
            runner.note(f"{base} and {n} ranks differ at {where}: {why}")
            noise.append(forensics)
            said = f" ({why})"
            continue
        judged = verdict == "fail"
        at = forensics.get("judged_step")
        if judged and at and at != div.step:  # rounding at first, a bug at a later step
            div = (
                first_divergence(
                    runs[base], runs[n], metrics=("loss", "grad_norm"), steps=range(at, at + 1)
                )
                or div
            )
            where = div.describe(f"{base}ranks", f"{n}ranks")
        summary = (
            f"{base} and {n} ranks diverge at {where}"
            if judged
            else f"{base} and {n} ranks differ at {where}, and neither a float64 replay nor the "
            f"noise floor can tell rounding from a real dependence: {why}"
        )
        cause = world_size_cause(div, _evidence(runs[base], runs[n], div, found))
        return CheckResult(
            "world-size",
            False,
            summary,
            divergence=div,
            diagnosis=f"{why}; {cause}" if why else cause,
            logs=runner.logs,
            notes=runner.take_notes(),
            forensics=forensics,
            judged=judged,
        )
    on = f"on {', '.join(map(str, sizes))} ranks"
    return CheckResult(
        "world-size",
        True,
        f"{steps} steps agree {on} {tolerance(rtol, atol)}"
        if not said
        else f"{steps} steps {on} differ only by rounding noise{said}",
        logs=runner.logs,
        notes=runner.take_notes() + skipped_notes(logged),
        forensics=noise[0] if noise else None,
    )


def _evidence(a: list[dict], b: list[dict], div: Divergence, found) -> dict:
    """What the runs' lines rule out: the initial weights (equal parameters), dropout."""
    x, y = by_step(a).get(div.step, {}), by_step(b).get(div.step, {})
    equal = x.get("param_digest") is not None and x.get("param_digest") == y.get("param_digest")
    watched = all(local_batch.findings(r)[1] == 1 for r in (a, b))
    dropout = any(kind == local_batch.DROPOUT and not done for (kind, _), done in found.items())
    return {"params_equal": equal, "no_dropout": watched and not dropout}


def world_size_cause(div: Divergence, evidence: dict | None = None) -> str:
    """The likely cause of `div`, naming only what `evidence` leaves possible."""
    evidence = evidence or {}
    if div.step == 1 and div.metric == "loss":
        weights = "" if evidence.get("params_equal") else "the initial weights (a per-rank " \
            "seed or init) or "  # fmt: skip
        return (
            f"at step 1, before any update, so the runs start apart: {weights}the data (a batch "
            "or split that depends on the world size), or a loss normalised per rank"
        )
    if div.step == 1:
        return (
            "at step 1, before any update, the loss agreeing: clipping or a norm on a local "
            "shard, or gradients not averaged over the ranks"
        )
    if evidence.get("no_dropout"):
        return (
            "a rank-local computation: clipping or a norm on a local shard, a loss or batch "
            "that depends on the world size, or per-rank randomness other than dropout (none "
            "ran, or it was switched off)"
        )
    return RANK_LOCAL


def judge_difference(runner: ScriptRunner, div: Divergence, sizes: tuple[int, int], runs: dict,
                     steps: int, rtol: float, atol: float) -> tuple[str, str, dict]:  # fmt: skip
    """pass, fail or not_judged for two world sizes that differ, why, and the forensics: the
    float64 replay decides where the script follows it, else the noise floor."""
    base, n = sizes
    every_step = False
    try:
        replay, every_step = float64_replay(runner, div, base, n, (runs[base], runs[n]), steps)
    except (UsageError, RankTimeout) as exc:
        replay = dv.Verdict(
            "unavailable",
            f"the float64 replay, which would tell rounding noise from a real dependence, "
            f"could not run: {exc}",
        )
    if replay.kind in ("factor", "dependence"):  # proved: the floor would add nothing
        floor, floored, failed = None, None, "noise floor: not measured (the replay decided)"
    else:
        floor, floored, failed = script_floor(
            runner, base, steps, (runs[base], runs[n]), rtol, atol
        )
    floor_text = f"noise floor: {floored.text}" if floored else failed
    forensics = {
        "parting": None,
        "verdict": replay.to_dict(),
        "reproduced": None,
        "noise_floor": {"floor": floor.to_dict(), "judgement": floored.to_dict()}
        if floor and floored
        else None,
        "lines": [f"float64 replay: {replay.text}", floor_text],
    }
    later = floored is not None and floored.kind == "beyond" and (floored.step or 0) > div.step
    if replay.kind == "noise" and not (later and not every_step):
        # a replay kept in float32 judged one step: the floor's later failure stands
        return "pass", "float64 replay", forensics
    if replay.kind in ("factor", "dependence"):
        forensics["judged_step"] = replay.step
        return "fail", replay.text, forensics
    if floored is not None and floored.kind in ("noise", "beyond"):
        verdict = "pass" if floored.kind == "noise" else "fail"
        forensics["judged_step"] = floored.step
        return verdict, f"noise floor: {floored.text}", forensics
    return "not_judged", f"{floor_text}; {replay.text}", forensics


def script_floor(runner: ScriptRunner, nproc: int, steps: int, runs: tuple[list, list],
                 rtol: float, atol: float):  # fmt: skip
    """The script's noise floor on `nproc` ranks and `runs` judged against it; (None, None,
    why) when a perturbed run could not run."""
    perturbed, floor, judged = [], None, None
    for i, env in enumerate(nf.PERTURBATIONS, 1):
        name = f"world-size-{nproc}-reordered-{i}"
        try:
            perturbed.append(runner.run(name, nproc=nproc, max_steps=steps, perturb=env))
        except (UsageError, RankTimeout) as exc:
            if floor is not None:
                break
            return (
                None,
                None,
                f"no noise floor: a run with its fp32 sums reordered could not run: {exc}",
            )
        floor = nf.measure(runs[0], perturbed)
        judged = nf.judge(*runs, floor, rtol, atol)
        if judged.kind != "zero":
            break
    return floor, judged, ""


def float64_replay(runner: ScriptRunner, div: Divergence, base: int, n: int, fp32, steps: int):
    """Both world sizes again with LOCKSTEP_DTYPE=float64: the verdict, and whether it judged
    every step (not when the script kept the metric in float32)."""
    if div.metric not in ("loss", "grad_norm") or not isinstance(div.expected, float):
        return dv.Verdict("unavailable", f"no float64 replay for {div.metric}"), False
    runs = {
        m: by_step(runner.run(f"world-size-{m}-float64", nproc=m, max_steps=steps, dtype="float64"))
        for m in (base, n)
    }
    a, b = runs[base].get(div.step, {}), runs[n].get(div.step, {})
    if (a.get(div.metric), b.get(div.metric)) == (div.expected, div.actual):
        return _kept_in_float32(div, a, b, fp32), False
    return _every_step(runs, base, n, fp32, div.step), True


def _every_step(runs: dict, base: int, n: int, fp32, first: int) -> dv.Verdict:
    """The replay at every step from `first` where the fp32 runs differ: the first that does not
    shrink, else the largest fp32 difference."""
    rows32 = [by_step(r) for r in fp32]
    worst = None
    for step in sorted(s for s in rows32[0] if s >= first):
        x32 = [r.get(step, {}) for r in rows32]
        a, b = runs[base].get(step, {}), runs[n].get(step, {})
        for metric in ("loss", "grad_norm"):
            pair32 = (x32[0].get(metric), x32[1].get(metric))
            if not all(isinstance(x, float) for x in pair32) or pair32[0] == pair32[1]:
                continue
            verdict = dv.float64_verdict(metric, pair32, (a.get(metric), b.get(metric)))
            verdict = _common_ratio(verdict, a, b, base, n)
            if verdict.kind != "noise":
                return replace(verdict, text=f"at step {step}: {verdict.text}", step=step)
            if worst is None or (verdict.rel32 or 0) > (worst.rel32 or 0):
                worst = replace(verdict, text=f"at step {step}: {verdict.text}", step=step)
    return worst or dv.Verdict("unavailable", "the float64 replay logged none of the steps")


def _kept_in_float32(div: Divergence, a: dict, b: dict, fp32) -> dv.Verdict:
    """The verdict when the replay gave the diverging metric's fp32 values back."""
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


def _common_ratio(verdict: dv.Verdict, a: dict, b: dict, base: int, n: int) -> dv.Verdict:
    """A dependence with one common ratio of loss and gradient norm: a normalisation bug."""
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
