"""The gate's workflows: record, check and refresh goldens, and what a check's outcome notes
and reports (the `--json` payload). Never a silent pass: docs/design/gates.md."""

from __future__ import annotations

import datetime as dt
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep import __version__
from lockstep.errors import EXIT_USAGE, LockstepError, UsageError
from lockstep.gate import envkey, golden
from lockstep.gate.compare import Finding, compare
from lockstep.gate.golden import Golden
from lockstep.gate.job import Job
from lockstep.gate.run_result import Run

EXIT_NO_GOLDEN = EXIT_USAGE  # no golden for this environment: record one first
# Fingerprint sections that differ between any two runs (free disk, limits): never reported.
VOLATILE_SECTIONS = ("resources",)


class NoGolden(LockstepError):
    exit_code = EXIT_NO_GOLDEN


@dataclass
class Environment:
    key: str
    fields: dict
    machine: str
    digests: dict
    legacy_key: str | None = None  # the key a golden of this environment had before

    @classmethod
    def current(cls, job: Job) -> Environment:
        from lockstep.env import fingerprint

        fp = fingerprint.collect()
        env = envkey.environment(fp, job.settings())
        key = envkey.key(env["key_fields"])
        return cls(key, env["key_fields"], env["machine"], fp["digests"], env["legacy_key"])

    def existing(self, directory: Path, name: str, progress=print) -> Path:
        """The golden's path under this key, else under the legacy key, with a line naming
        the rename that keeps it found."""
        path = golden.golden_path(directory, name, self.key)
        if path.is_file() or self.legacy_key in (None, self.key):
            return path
        old = golden.golden_path(directory, name, self.legacy_key)
        if old.is_file():
            progress(
                f"lockstep gate: the golden is under its old key {self.legacy_key} (keys now "
                f"hold only what the job uses); rename it: git mv {old} {path}"
            )
            return old
        return path


def record_runs(job: Job, repeats: int, workdir: Path, progress=print) -> list[Run]:
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: need at least 1 (3 or more for tolerances)")
    runs = []
    for i in range(repeats):
        progress(f"lockstep gate: run {i + 1}/{repeats} ({job.arguments()})")
        runs.append(job.run(workdir / f"repeat-{i + 1}", progress=progress))
    return runs


def build_golden(name: str, job: Job, env: Environment, runs: list[Run]) -> Golden:
    header = {
        "name": name,
        "env_key": env.key,
        "env": {"key_fields": env.fields},
        "machine": env.machine,
        "fingerprint_digests": env.digests,
        "job": job.describe(),
        "config_digest": job.digest(),
        "lockstep_version": __version__,
        "git_revision": git_revision(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return golden.build(runs, header)


def git_revision(cwd: Path | None = None) -> str | None:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=cwd,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty.strip() else "")


def find_golden(directory: Path, name: str, env: Environment, job: Job, progress=print) -> Golden:
    path = env.existing(directory, name, progress)
    if path.is_file():
        return golden.read(path)
    others = golden.recorded(directory, name)
    near = envkey.nearest(env.fields, others)
    hint = (
        f"; nearest recorded: {near[0]} (differs in {', '.join(near[1]) or 'nothing'})"
        if near
        else f"; no golden named '{name}' under {directory} at all"
    )
    raise NoGolden(
        f"no golden '{name}' for this environment {env.key}{hint}; record one with: "
        f"lockstep gate record {name} {job.arguments()} --dir {directory}"
    )


def record(
    name: str, job: Job, repeats: int, directory: Path, workdir: Path | None = None, progress=print
) -> Golden:
    env = Environment.current(job)
    path = golden.golden_path(directory, name, env.key)
    if path.is_file():
        raise UsageError(
            f"{path} exists; to replace it and see what changes run: lockstep gate refresh "
            f"{name} {job.arguments()} --dir {directory}"
        )
    with _workdir(workdir) as wd:
        runs = record_runs(job, repeats, wd, progress)
    g = build_golden(name, job, env, runs)
    golden.write(g, path)
    return g


@dataclass
class CheckOutcome:
    golden: Golden
    run: Run
    findings: list[Finding]
    env: Environment
    env_diff: list[str]

    @property
    def failed(self) -> bool:
        return any(f.failed for f in self.findings)

    @property
    def verdict(self) -> str:
        """`fail`, else `not_judged` where a finding could not decide, else `pass`."""
        if self.failed:
            return "fail"
        return "not_judged" if any(f.status == "not_judged" for f in self.findings) else "pass"

    def notes(self, refresh: str | None = None, job: Job | None = None) -> list[str]:
        """What the report says beside the findings: how the job and environment differ from
        the golden's, and with `refresh` (a command line) how to re-baseline."""
        header = self.golden.header
        notes = job_notes(job, header) if job is not None else []
        if self.env_diff:
            notes.append("environment differs from the golden's: " + "; ".join(self.env_diff))
        if self.env is not None:
            recorded = header.get("fingerprint_digests", {})
            moved = sorted(
                s
                for s, d in self.env.digests.items()
                if s not in VOLATILE_SECTIONS and recorded.get(s) not in (None, d)
            )
            if moved:
                notes.append(
                    "fingerprint sections that differ from the golden's (not numerics-keyed): "
                    + ", ".join(moved)
                )
            if self.env.machine != header.get("machine"):
                notes.append(f"machine: golden {header.get('machine')}, this {self.env.machine}")
        if self.failed and refresh:
            notes.append(f"if this change is intended, re-baseline with: {refresh}")
        return notes

    def to_dict(self, notes: list[str], plots: list[str]) -> dict:
        """The `--json` report of `gate check` and `gate compare`."""
        return {
            "golden": str(self.golden.path),
            "env_key": self.golden.env_key,
            "verdict": self.verdict,
            "passed": self.verdict == "pass",
            "findings": [f.to_dict() for f in self.findings],
            "run": {
                "steps": len(self.run.rows),
                "wall_s": self.run.wall_s,
                "peak_rss_bytes": self.run.peak_rss_bytes,
                "gpu_mem_bytes": self.run.gpu_mem_bytes,
                "log": self.run.log,
            },
            "notes": notes,
            "plots": plots,
        }


def job_notes(job: Job, header: dict) -> list[str]:
    """How the job that ran differs from the one the golden was recorded with."""
    notes = []
    if job.digest() != header.get("config_digest"):
        notes.append("the job's config or script differs from the one the golden was recorded with")
    recorded_run_path = bool(header.get("job", {}).get("run_path"))
    if job.run_path != recorded_run_path:
        how = {True: "with --run-path", False: "without --run-path"}
        notes.append(
            f"the golden was recorded {how[recorded_run_path]}, this run is {how[job.run_path]}: "
            "peak RSS differs between forked ranks and new interpreters"
        )
    return notes


def check(
    name: str, job: Job, directory: Path, workdir: Path | None = None, progress=print
) -> CheckOutcome:
    env = Environment.current(job)
    g = find_golden(directory, name, env, job, progress)
    with _workdir(workdir) as wd:
        progress(f"lockstep gate: checking {name} against {g.path}")
        run = job.run(wd / "check", progress=progress)
    return outcome(g, run, env)


def outcome(g: Golden, run: Run, env: Environment | None) -> CheckOutcome:
    """Compare and attach the environment fields that differ from the golden's."""
    fields = g.header.get("env", {}).get("key_fields", {})
    diff = envkey.differences(fields, env.fields) if env else []
    same_machine = env is None or env.machine == g.header.get("machine")
    return CheckOutcome(g, run, compare(g, run, same_machine=same_machine), env, diff)


def movement(old: Golden, new: Golden) -> list[dict]:
    """Per metric: how far the new golden's centers move from the old ones."""
    out = []
    common = np.intersect1d(old.steps, new.steps)
    oi = np.searchsorted(old.steps, common)
    ni = np.searchsorted(new.steps, common)
    for metric in new.centers:
        if metric not in old.centers:
            out.append({"metric": metric, "note": "new metric"})
            continue
        a, b = old.centers[metric][oi], new.centers[metric][ni]
        with np.errstate(all="ignore"):
            diff = np.abs(b - a)
            rel = diff / np.abs(a)
        moved = np.flatnonzero(diff > 0)
        out.append(
            {
                "metric": metric,
                "max_abs_change": float(np.nanmax(diff)) if diff.size else 0.0,
                "max_rel_change": float(np.nanmax(np.where(np.isfinite(rel), rel, 0)))
                if diff.size
                else 0.0,
                "steps_changed": int(moved.size),
                "first_changed_step": int(common[moved[0]]) if moved.size else None,
                "steps_compared": int(common.size),
            }
        )
    for name, rec in new.header["perf"].items():
        before = old.header.get("perf", {}).get(name)
        if before:
            change = rec["center"] / before["center"] - 1 if before["center"] else None
            out.append({"metric": name, "perf_change": change})
    return out


def refresh(
    name: str, job: Job, repeats: int, directory: Path, workdir: Path | None = None, progress=print
) -> tuple[Golden, Golden | None, list[dict], str | None]:
    """Record anew; the old file is replaced only once the new one is complete, an unreadable
    one too (the fourth value says why it was)."""
    env = Environment.current(job)
    path = golden.golden_path(directory, name, env.key)
    old, unreadable = None, None
    if (found := env.existing(directory, name, progress)).is_file():
        try:
            old = golden.read(found)
        except UsageError as err:
            unreadable = str(err).removesuffix(golden.ADVICE)
            progress(f"lockstep gate: the golden there is unreadable, refresh replaces it: {err}")
    with _workdir(workdir) as wd:
        runs = record_runs(job, repeats, wd, progress)
    new = build_golden(name, job, env, runs)
    golden.write(new, path)
    return new, old, movement(old, new) if old else [], unreadable


class _workdir:
    """A caller's folder, or a temporary one removed afterwards."""

    def __init__(self, path: Path | None):
        self.path, self._tmp = path, None

    def __enter__(self) -> Path:
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            return self.path
        self._tmp = tempfile.TemporaryDirectory(prefix="lockstep-gate-")
        return Path(self._tmp.name)

    def __exit__(self, exc_type, *exc) -> None:
        if self._tmp is None:
            return
        if exc_type is None:
            self._tmp.cleanup()
        else:  # keep the failed run's log that the error names
            self._tmp._finalizer.detach()
