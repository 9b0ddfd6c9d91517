"""The performance A/B gate: base and head alternated on the same machine in one job.
Design: docs/design/gates.md."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from lockstep.errors import UsageError
from lockstep.gate import stats
from lockstep.gate.compare import Finding
from lockstep.gate.job import Job
from lockstep.gate.run_result import Run, summary

# Run-level figures compared, and which way is worse.
FIGURES = {
    "step_time_s": "lower",
    "tokens_per_s": "higher",
    "peak_rss_bytes": "lower",
    "mem_bytes": "lower",
    "gpu_mem_bytes": "lower",
    "wall_s": "lower",
}


@dataclass
class Comparison:
    figure: str
    base: list[float]
    head: list[float]
    ratio: float  # head / base, medians
    low: float
    high: float
    p_worse: float  # one-sided: head is worse than base
    worse_ratio: float  # the ratio expressed so that > 1 is worse
    regression: bool

    def to_dict(self) -> dict:
        return asdict(self)


def worktree(repo: Path, ref: str, into: Path) -> Path:
    """Check out `ref` of `repo` into a detached worktree under `into`."""
    target = into / "base"
    try:
        subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", f"{ref}^{{commit}}"],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError):
        raise UsageError(f"--base {ref}: not a commit of the git repository at {repo}") from None
    try:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--force", str(target), ref],
            check=True,
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or str(err).encode()
        line = detail.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"git worktree add {ref} failed: {line[0]}") from None
    return target


def remove_worktree(repo: Path, target: Path) -> None:
    """Remove the worktree at `target` and its folder, also one a killed `git worktree add`
    left half made or locked."""
    for args in (["unlock", str(target)], ["remove", "--force", "--force", str(target)], ["prune"]):
        try:
            subprocess.run(["git", "-C", str(repo), "worktree", *args], capture_output=True,
                           timeout=120)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
    shutil.rmtree(target, ignore_errors=True)


def repo_root(start: Path) -> Path:
    try:
        out = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "--show-toplevel"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError):
        raise UsageError(
            f"{start} is not inside a git repository; `gate ab` compares git refs"
        ) from None
    return Path(out.stdout.strip())


def alternate(
    job: Job, base_tree: Path, head_tree: Path, rounds: int, workdir: Path, progress=print
) -> tuple[list[Run], list[Run]]:
    """`rounds` runs each, in the order AB, BA, AB, ... on the same ranks. The head runs
    here; the base runs in the same folder of its worktree, with its own `src/` first."""
    if rounds < 2:
        raise UsageError(f"--rounds {rounds}: need at least 2 (5 or more to find a change)")
    here = Path.cwd().resolve()
    base_cwd = base_tree / here.relative_to(head_tree.resolve())
    base, head = [], []
    for i in range(rounds):
        order = [("base", base, base_tree, base_cwd), ("head", head, None, None)]
        if i % 2:
            order.reverse()
        for label, runs, tree, cwd in order:
            progress(f"lockstep gate ab: round {i + 1}/{rounds}: {label}")
            runs.append(
                job.run(workdir / f"round-{i + 1}-{label}", tree=tree, cwd=cwd, progress=progress)
            )
    return base, head


def judge(base: list[Run], head: list[Run], threshold: float, alpha: float) -> list[Comparison]:
    b_sum, h_sum = [summary(r) for r in base], [summary(r) for r in head]
    has_step_time = all("step_time_s" in s for s in b_sum + h_sum)
    out = []
    for figure, direction in FIGURES.items():
        if not all(figure in s for s in b_sum + h_sum):
            continue
        if figure == "wall_s" and has_step_time:
            continue  # the start of the processes is in it; step times say more
        b = [s[figure] for s in b_sum]
        h = [s[figure] for s in h_sum]
        ratio, low, high = stats.ratio_interval(h, b)
        if direction == "lower":
            p = stats.mann_whitney_greater(h, b)
            worse = ratio
        else:
            p = stats.mann_whitney_greater(b, h)
            worse = 1 / ratio if ratio else float("inf")
        out.append(
            Comparison(
                figure,
                b,
                h,
                ratio,
                low,
                high,
                p,
                worse,
                regression=worse > 1 + threshold and p < alpha,
            )
        )
    return out


def findings(comparisons: list[Comparison], threshold: float, alpha: float) -> list[Finding]:
    out = []
    for c in comparisons:
        change = c.worse_ratio - 1
        text = (
            f"head/base {c.ratio:.3f} (95% CI {c.low:.3f}..{c.high:.3f}), "
            f"{'worse' if change > 0 else 'better'} by {abs(change):.1%}, p={c.p_worse:.4f} "
            f"(fails at > {threshold:.0%} and p < {alpha:g})"
        )
        out.append(
            Finding(
                "ab",
                c.figure,
                "fail" if c.regression else "pass",
                text,
                value=c.ratio,
                center=1.0,
                band=threshold,
                rel_err=abs(change),
                worse=change > 0,
            )
        )
    return out


TMP_PREFIX = "lockstep-ab-"  # then the pid of the gate ab that made it (`owned_tempdir`)


def prune_orphans(repo: Path) -> None:
    """What a `gate ab` killed before its cleanup (SIGKILL) left: its temporary folder and
    the base worktree registered in `repo`."""
    from lockstep.launch import orphaned_tempdirs

    orphans = orphaned_tempdirs(TMP_PREFIX)
    for path in orphans:
        remove_worktree(repo, Path(path) / "base")
        shutil.rmtree(path, ignore_errors=True)
    if orphans:
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True,
                       check=False)  # fmt: skip


def run_ab(
    job: Job,
    ref: str,
    rounds: int,
    threshold: float,
    alpha: float,
    workdir: Path | None = None,
    progress=print,
):
    """Check out `ref`, alternate, judge: (comparisons, findings). The worktree and the
    temporary folder go however it ends (SIGTERM and SIGHUP raise here)."""
    from lockstep.launch import owned_tempdir, signals_deferred, signals_raise

    if job.run_path:  # forked ranks would run the base tree's script with this tree's lockstep
        raise UsageError(
            "gate ab runs the base tree's code, which a forkserver holding this tree's "
            "lockstep cannot: drop --run-path"
        )
    head_tree = repo_root(Path.cwd())
    prune_orphans(head_tree)
    with signals_raise():
        tmp = None
        try:
            # deferred: raised before the folder is named, or mid-add (git left locked
            # "initializing"), a signal would escape the cleanup
            with signals_deferred():
                tmp = Path(owned_tempdir(TMP_PREFIX))
                base_tree = worktree(head_tree, ref, tmp)
            wd = workdir or tmp / "runs"
            base, head = alternate(job, base_tree, head_tree, rounds, wd, progress)
        finally:
            with signals_deferred():  # a second Ctrl-C or SIGTERM waits for the cleanup
                if tmp is not None:
                    remove_worktree(head_tree, tmp / "base")
                    shutil.rmtree(tmp, ignore_errors=True)
    comparisons = judge(base, head, threshold, alpha)
    found = health(base, head) + findings(comparisons, threshold, alpha)
    if not comparisons:  # nothing compared is no pass
        found.append(Finding("ab", "speed", "not_judged", f"no figure of {', '.join(FIGURES)} "
                             "was logged by every run: nothing to compare"))  # fmt: skip
    return comparisons, found


def health(base: list[Run], head: list[Run]) -> list[Finding]:
    """Speed and memory of a run that is NaN or does not train are no verdict: a broken head
    run fails; a broken base run alone leaves the A/B not judged."""
    from lockstep import run_health

    out = []
    for side, runs, status in (("head", head, "fail"), ("base", base, "not_judged")):
        for i, run in enumerate(runs, 1):
            found = run_health.problem(run.rows, ("loss", "grad_norm", "lr"))
            if found is not None:
                text = f"{side} run {i}: {found.text}"
                out.append(Finding("ab", found.metric, status, text, step=found.step))
                break
    return out


def to_dict(
    base: str,
    rounds: int,
    threshold: float,
    alpha: float,
    comparisons: list[Comparison],
    findings: list[Finding],
) -> dict:
    """The `--json` report of `gate ab`."""
    return {
        "base": base,
        "rounds": rounds,
        "threshold": threshold,
        "alpha": alpha,
        "verdict": verdict(findings),
        "passed": verdict(findings) == "pass",
        "comparisons": [c.to_dict() for c in comparisons],
    }


def verdict(findings: list[Finding]) -> str:
    """`fail` if a finding failed, else `not_judged` if one could not decide, else `pass`."""
    if any(f.failed for f in findings):
        return "fail"
    return "not_judged" if any(f.status == "not_judged" for f in findings) else "pass"
