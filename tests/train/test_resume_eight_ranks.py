"""A ddp resume at 8 ranks is bitwise, as at 2: the resumed job's steps and final parameters are
the uninterrupted run's.

At 2 ranks a sum is the same in either order; at 8, gloo's ring all-reduce adds an element's
values in an order set by its offset in DDP's gradient bucket, and a fresh DDP reduces its first
step with its parameters in another order in the bucket than the later steps of a run
(`DDPEngine.prime_buckets`). Without the priming the resumed job's final digest here differs
(its metrics of steps 3-4 do not yet; on 4 ranks the grad norm of step 4 does). One launch of 8 ranks (forked, torch already imported): the
uninterrupted run, then a new `Trainer` on the same ranks that resumes from its step-2
checkpoint (a new DDP, as after a restart; the 2-rank engine tests resume in new processes).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from lockstep.launch import run_local

SMOKE = Path(__file__).resolve().parents[2] / "smoke" / "cpu-ddp.toml"
NPROC = 8
RUN = [
    "steps=4",
    "batch.global_size=64",  # micro 4: 2 micro batches a step at 8 ranks
    "batch.grad_accum=0",
    "checkpoint.every=2",
    "checkpoint.keep=10",
    'logging.wandb="disabled"',
    "logging.progress=false",
]
KEYS = ("step", "loss", "grad_norm", "clip_coef", "lr")


def rank_runs(base: str) -> dict | None:
    """One rank: the uninterrupted run, then the resumed one; rank 0 returns both."""
    import torch.distributed as dist

    from lockstep.train.config import load_config
    from lockstep.train.trainer import run_training

    dist.init_process_group("gloo")
    out = Path(base)
    straight = run_training(load_config(SMOKE, [*RUN, 'checkpoint.resume="never"']), out / "a")
    resume = f'checkpoint.resume="{out / "a" / "checkpoints" / "step_00000002"}"'
    resumed = run_training(
        load_config(SMOKE, [*RUN, resume, f'checkpoint.dir="{out / "b"}"']), out / "b"
    )
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    if rank:
        return None
    return {
        name: {"digest": r.param_digest, "steps": [asdict(s) for s in r.steps]}
        for name, r in (("straight", straight), ("resumed", resumed))
    }


def test_a_ddp_resume_at_eight_ranks_is_bitwise(tmp_path):
    saved = dict(os.environ)  # run_local sets the ranks' variables in this process
    try:
        runs = run_local(rank_runs, (str(tmp_path),), NPROC, "resume8", "cpu")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    straight, resumed = runs["straight"], runs["resumed"]
    assert [s["step"] for s in resumed["steps"]] == [3, 4]
    rows = [[s[k] for k in KEYS] for s in resumed["steps"]]
    assert rows == [[s[k] for k in KEYS] for s in straight["steps"][2:]]
    assert resumed["digest"] == straight["digest"]
