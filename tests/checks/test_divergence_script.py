"""The world-size check on a user's script tells rounding noise from a real dependence by
replaying the diverging step in float64 (LOCKSTEP_DTYPE, `lockstep.track.replay_dtype`):
examples/train_padded.py, padded variable-length sequences whose loss is normalised by the
global token count, passes 1 against 2 ranks even at a tolerance its fp32 rounding exceeds;
averaging per-rank means fails, named."""

from pathlib import Path

from support.script_check import check

PADDED = Path(__file__).resolve().parents[2] / "examples" / "train_padded.py"


def test_global_token_count_passes_per_rank_means_fail(tmp_path):
    (tmp_path / "correct").mkdir()
    (tmp_path / "per-rank").mkdir()
    proc, results = check(
        "world-size", "--script", str(PADDED), "--run-path", "--rtol", "1e-12", "--atol", "0",
        cwd=tmp_path / "correct", steps="3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = results
    assert result["passed"] and "rounding noise" in result["summary"], result
    assert result["forensics"]["verdict"]["kind"] == "noise"
    assert result["forensics"]["verdict"]["rel64"] < 1e-12 < result["forensics"]["verdict"]["rel32"]

    proc, results = check(
        "world-size", "--script", f"{PADDED} --per-rank-mean", "--run-path",
        cwd=tmp_path / "per-rank", steps="3",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    assert not result["passed"] and result["forensics"]["verdict"]["kind"] == "dependence"
    assert result["diagnosis"].startswith("at step 2: a real dependence, not rounding"), result
    assert result["divergence"]["step"] == 2, result  # rounding at step 1, the bug from 2


def test_a_watched_script_names_the_module(tmp_path):
    """examples/train_protocol.py with `track.watch(model)` and an unseeded data order: the
    determinism check's replay names the first Linear's forward at step 1."""
    from support.script_check import EXAMPLE

    line = "opt = torch.optim.AdamW(model.parameters(), lr=0.05)\n"
    source = EXAMPLE.read_text().replace("random.Random(epoch)", "random.Random()")
    assert line in source
    script = tmp_path / "train_watched.py"
    script.write_text(source.replace(line, line + "track.watch(model)\n"))
    proc, results = check("determinism", "--script", str(script), "--run-path", cwd=tmp_path,
                          steps="2")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    part = result["forensics"]["parting"]
    assert (part["step"], part["phase"], part["name"]) == (1, "forward", "0#0"), result
    assert "first parting: step 1, forward: output of module 0#0" in proc.stdout
