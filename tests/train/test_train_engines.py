"""Each engine on CPU/gloo at 2 ranks: trains, checkpoints, resumes in fresh processes to the
same state and trajectory; the engines agree with each other; the CLI path and corrupt
checkpoints. Two launches for all engines, shared through fixtures."""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
import train_worker

from lockstep.cli import main
from lockstep.launch import run_local
from lockstep.track import read as read_metrics
from lockstep.train import engines
from support.inprocess import run_main
from support.once import once

ROOT = Path(__file__).resolve().parents[2]
ENGINES = list(engines.ENGINES)  # ddp first: the reference the others agree with
QUIET = ['logging.wandb="disabled"', "logging.progress=false"]
# 4 steps, 2 micro batches per step, clipping active, checkpoints at steps 2 and 4.
RUN = ["steps=4", "checkpoint.every=2", "clip.max_norm=1.0", "batch.grad_accum=2", *QUIET]


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory):
    """engine -> (straight summary, resumed summary, state at save, state after load).

    Two launches of 2 ranks for all engines (`lockstep.launch.run_local`, the launcher of
    `lockstep train --nproc`): every engine straight, then every engine resumed in new
    processes from its step-2 checkpoint; once per test run, whichever worker needs it first."""

    def make(base: Path) -> None:
        saved = dict(os.environ)  # run_local sets the ranks' variables in this process
        try:
            for mode in ("straight", "resume"):
                args = (mode, str(base), ",".join(ENGINES), *RUN)
                run_local(train_worker.main, args, 2, "engines", "cpu")
        finally:
            os.environ.clear()
            os.environ.update(saved)

    base = once(tmp_path_factory, "engine-runs", make)

    def get(engine: str):
        out = base / engine
        summaries = [json.loads((out / f"{m}.json").read_text()) for m in ("straight", "resume")]
        states = [
            torch.load(out / f"{m}-state.pt", weights_only=False) for m in ("straight", "resume")
        ]
        return (*summaries, *states)

    return get


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_trains_and_resumes_exactly(engine_runs, engine):
    straight, resumed, saved, loaded = engine_runs(engine)
    losses = [s["loss"] for s in straight["steps"]]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    assert all(s["grad_norm"] > 0 and 0 < s["clip_coef"] <= 1 for s in straight["steps"])
    # The loaded state is the saved state: model, optimizer, LR schedule, step, data position.
    assert loaded["step"] == saved["step"] == 2
    assert loaded["lr"] == saved["lr"] and loaded["data"] == saved["data"]
    assert saved["params"].keys() == loaded["params"].keys()
    for name, value in saved["params"].items():
        assert torch.equal(value, loaded["params"][name]), name
    assert saved["optimizer"].keys() == loaded["optimizer"].keys() and saved["optimizer"]
    for name, state in saved["optimizer"].items():
        assert {"exp_avg", "exp_avg_sq"} <= state.keys(), name
        for key, value in state.items():
            assert torch.equal(value, loaded["optimizer"][name][key]), (name, key)
    # ...and the resumed run continues on the uninterrupted trajectory, bitwise.
    keys = ("step", "loss", "grad_norm", "clip_coef", "lr")
    assert [[s[k] for k in keys] for s in resumed["steps"]] == [
        [s[k] for k in keys] for s in straight["steps"][2:]
    ]
    assert resumed["digest"] == straight["digest"]


def test_engines_agree_with_each_other(engine_runs):
    """On CPU/gloo in fp32 the engines agree to printed precision; hold them to 1e-5."""
    reference = engine_runs("ddp")[0]["steps"]
    for engine in ENGINES[1:]:
        for mine, ref in zip(engine_runs(engine)[0]["steps"], reference, strict=True):
            for key in ("loss", "grad_norm", "lr"):
                assert mine[key] == pytest.approx(ref[key], rel=1e-5), (engine, mine["step"], key)


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory):
    """`lockstep train --nproc 2` itself: metrics, checkpoints, wandb offline files."""
    env = {"OMP_NUM_THREADS": "1"}
    sets = [
        a for s in ["steps=3", "checkpoint.every=2", "logging.progress=false"] for a in ("--set", s)
    ]

    def make(folder: Path) -> None:
        argv = ["train", "smoke/cpu-ddp.toml", "--nproc", "2", "--out", str(folder / "run")]
        proc = run_main([*argv, *sets], ROOT, env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        (folder / "stdout").write_text(proc.stdout)

    folder = once(tmp_path_factory, "cli-run", make)
    return folder / "run", (folder / "stdout").read_text()


def test_cli_writes_metrics_checkpoints_and_wandb(cli_run):
    out, stdout = cli_run
    assert "lockstep: trained to step 3" in stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) == {
        "step", "loss", "grad_norm", "clip_coef", "lr", "tokens", "tokens_per_s",
        "step_time_s", "mem_bytes", "mem_kind", "loss_scale", "skipped", "mem_frac",
        "sync_time_s", "time",
    }  # fmt: skip
    assert rows[0]["mem_kind"] == "cpu_rss" and rows[0]["tokens"] == 4 * 2 * 2 * 32
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000003"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000002", "step_00000003"]
    manifest = json.loads((ckpts / "step_00000003" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and "rng/rank00001.pt" in manifest["files"]
    assert list((out / "wandb").glob("offline-run-*"))


def test_corrupt_checkpoint_is_named_not_ignored(cli_run, tmp_path, capsys):
    out, _ = cli_run
    copy = tmp_path / "run"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    victim = next((copy / "checkpoints" / "step_00000003" / "dcp").glob("*.distcp"))
    victim.write_bytes(victim.read_bytes()[:-100])
    code = main(["train", str(ROOT / "smoke/cpu-ddp.toml"), "--nproc", "2", "--out", str(copy)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "step_00000003 is corrupt" in err[0] and victim.name in err[0] and "truncated" in err[0]


def test_dangling_latest_pointer_is_an_error(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_00000009\n")
    code = main(["train", str(ROOT / "smoke/cpu-ddp.toml"), "--out", str(tmp_path)])
    assert code == 2 and "step_00000009, which does not exist" in capsys.readouterr().err
