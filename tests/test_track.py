"""lockstep.track.log: rank 0 writes the protocol's JSONL and forwards to an active wandb run."""

import json

from lockstep import track


def test_rank0_writes_one_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("LOCKSTEP_METRICS", str(path))
    monkeypatch.setenv("RANK", "0")
    track.log(1, loss=2.5, lr=0.1)
    track.log(2, loss=float("inf"))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"step": 1, "loss": 2.5, "lr": 0.1}, {"step": 2, "loss": "inf"}]


def test_other_ranks_write_nothing(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("LOCKSTEP_METRICS", str(path))
    monkeypatch.setenv("RANK", "1")
    track.log(1, loss=1.0)
    assert not path.exists()


def test_protocol_reads_the_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_MAX_STEPS", "7")
    monkeypatch.setenv("LOCKSTEP_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("LOCKSTEP_RESUME", "1")
    p = track.protocol()
    assert (p.max_steps, p.checkpoint_dir, p.resume) == (7, tmp_path, True)


def test_forwards_to_an_offline_wandb_run(tmp_path, monkeypatch):
    import wandb

    monkeypatch.delenv("LOCKSTEP_METRICS", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="lockstep-test")
    try:
        track.log(3, loss=0.25)
        assert run.summary["loss"] == 0.25
    finally:
        run.finish()
