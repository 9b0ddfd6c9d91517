"""lockstep.track.log: rank 0 writes the protocol's JSONL and forwards to an active wandb run."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from lockstep import state_digest, track


def test_rank0_writes_one_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("LOCKSTEP_METRICS", str(path))
    monkeypatch.setenv("RANK", "0")
    before = time.time()
    track.log(1, loss=2.5, lr=0.1)
    track.log(2, loss=float("inf"), time=12.5)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert before <= lines[0].pop("time") <= time.time()  # end of the step, unix seconds
    assert lines == [{"step": 1, "loss": 2.5, "lr": 0.1}, {"step": 2, "loss": "inf", "time": 12.5}]


def test_other_ranks_write_nothing(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("LOCKSTEP_METRICS", str(path))
    monkeypatch.setenv("RANK", "1")
    track.log(1, loss=1.0)
    assert not path.exists()


def test_rank_placeholder_gives_every_rank_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_METRICS", str(tmp_path / "m-{rank}.jsonl"))
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        track.log(1, loss=1.0)
    assert json.loads((tmp_path / "m-1.jsonl").read_text())["loss"] == 1.0
    assert (tmp_path / "m-0.jsonl").exists()


@pytest.fixture(autouse=True)
def no_hooks_left():
    """`log` hooks every module call once LOCKSTEP_METRICS is set: none outlives a test."""
    yield
    state_digest.stop_observing()


def test_model_digest_is_exact_and_buffers_are_read_as_the_forward_enters(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("LOCKSTEP_METRICS", str(path))
    monkeypatch.setenv("RANK", "0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    track.log(1, loss=1.0, model=model)  # no forward seen yet: no buffer digest
    twin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    twin.load_state_dict(model.state_dict())
    twin.train()(torch.randn(3, 4))  # entered with the initial statistics, then updates them
    track.log(2, loss=1.0, model=twin)
    with torch.no_grad():
        twin[0].weight[1, 2] = torch.nextafter(twin[0].weight[1, 2], torch.tensor(9.0))
    twin(torch.randn(3, 4))
    track.log(3, loss=1.0, model=twin)
    a, b, c = [json.loads(x) for x in path.read_text().splitlines()]
    assert "buffer_digest" not in a and a["param_digest"] == b["param_digest"]
    assert b["buffer_digest"] == track.digests(model)["buffer_digest"]
    assert c["param_digest"] != b["param_digest"]  # one ulp in one weight
    assert c["buffer_digest"] != b["buffer_digest"]  # the statistics step 2's forward left
    assert "buffers" not in b  # each buffer's own digest: only where every rank writes


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
        assert "time" not in set(run.summary.keys())  # wandb summaries have no __contains__
    finally:
        run.finish()


FINISHING = """
import sys
import torch.distributed as dist
import wandb
from lockstep import track

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
run = wandb.init(mode="offline", dir=sys.argv[1], project="lockstep-test")
track.log(1, loss=0.5)
print("still in the buffer", end="")  # stdout is a pipe: block-buffered until flushed
track.finish(3)
print("never reached")
"""


def test_finish_ends_without_finalization_and_loses_nothing(tmp_path):
    """`finish` exits at once with its code, after the group, the wandb run and stdout are done
    with: the offline wandb run finished, the buffered line reached the pipe."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "WANDB_SILENT": "true", "RANK": "0", "TMPDIR": str(temp)}
    env.pop("LOCKSTEP_METRICS", None)
    proc = subprocess.run([sys.executable, "-c", FINISHING, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "still in the buffer"
    # wandb's temporary folders of its import (as Python's exit would remove them)
    assert not list(temp.iterdir())
    # wandb's own logs of a finished run (a bare os._exit leaves neither line)
    assert "finishing run" in (tmp_path / "wandb" / "debug.log").read_text()
    (internal,) = tmp_path.glob("wandb/offline-run-*/logs/debug-internal.log")
    assert "stream: all finished" in internal.read_text()
