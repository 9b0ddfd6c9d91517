"""`lockstep check` without `--out` runs in a temporary folder of its own: removed, checkpoints
and all, when every check passes; kept, and named, when one fails."""

from __future__ import annotations

import tempfile
from pathlib import Path

from support.inprocess import run_main
from support.teardown_abort import rerun_once_on_abort

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_protocol.py"
FORGETS_RNG = ('    torch.set_rng_state(state["rng"])\n', "")  # a resume that loses the RNG


def test_check_removes_its_temporary_runs_on_success_and_keeps_them_on_failure(
    tmp_path, monkeypatch
):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where mkdtemp makes the folder

    def check(script: Path):
        argv = ["check", "resume", "--script", str(script), "--nproc", "1", "--steps", "4"]
        launch = lambda: run_main([*argv, "--run-path"], tmp_path)  # noqa: E731
        return rerun_once_on_abort(launch, lambda done: done.stdout + done.stderr)

    passed = check(EXAMPLE)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert not list(temp.glob("lockstep-check-*"))  # its checkpoints used to stay here

    old, new = FORGETS_RNG
    source = EXAMPLE.read_text()
    assert source.count(old) == 1, f"the example no longer contains {old!r}"
    broken = tmp_path / "train_rng.py"
    broken.write_text(source.replace(old, new))
    failed = check(broken)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (kept,) = temp.glob("lockstep-check-*")
    assert f"runs and logs: {kept}" in failed.stdout
    assert list(kept.rglob("run.log")) and list(kept.rglob("*checkpoint*"))
