"""`lockstep check --script` in the test process (`inprocess.run_main`), rerun once on gloo's
known abort at exit (`teardown_abort`); and the example script the checks run on."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from lockstep.launch.progress import LINE
from support.inprocess import run_main
from support.teardown_abort import rerun_once_on_abort

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_protocol.py"


def check(
    *args: str, cwd: Path, steps: str = "4", rerun: bool = True
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out_json, runs = cwd / "result.json", cwd / "runs"
    argv = ["check", *args, "--steps", steps, "--out", str(runs), "--json", str(out_json)]

    def launch() -> subprocess.CompletedProcess:
        shutil.rmtree(runs, ignore_errors=True)
        out_json.unlink(missing_ok=True)
        return run_main(argv, cwd)

    def logs(proc: subprocess.CompletedProcess) -> str:
        return proc.stderr + "".join(p.read_text(errors="replace") for p in runs.rglob("run.log"))

    proc = rerun_once_on_abort(launch, logs) if rerun else launch()
    results = json.loads(out_json.read_text()) if out_json.exists() else []
    return proc, results


def error_lines(stderr: str) -> list[str]:
    """stderr without the runs' progress lines (`lockstep.launch.progress.LINE`)."""
    return [line for line in stderr.strip().splitlines() if not LINE.match(line)]


def planted(tmp_path: Path, name: str, replacements) -> Path:
    """The example with each (old, new) of `replacements` made, as train_NAME.py: a bug planted
    in the very script docs/scripts.md shows."""
    source = EXAMPLE.read_text()
    for old, new in replacements:
        assert source.count(old) == 1, f"the example no longer contains {old!r}"
        source = source.replace(old, new)
    path = tmp_path / f"train_{name}.py"
    path.write_text(source)
    return path
