"""The replicas check: data-parallel replicas agree exactly after every step, on the reference
job and on a script. Design: docs/design/checks.md.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from lockstep.checks.harness import without_checkpoints, world_size
from lockstep.checks.result import CheckResult, skipped_notes, unsound
from lockstep.checks.script_runs import Runs, ScriptRunner, require_steps
from lockstep.checks.trajectory import Divergence, agrees, by_step
from lockstep.errors import UsageError
from lockstep.state_digest import EMPTY_DIGEST, EnteringBuffers, digests
from lockstep.train.config import RunConfig
from lockstep.train.trainer import Trainer

# in the order a step computes them: the first that differs says what departed
REPLICA_QUANTITIES = ("loss", "grad_norm", "param_digest", "buffer_digest")


def replica_departed(quantity: str, step: int, rank: int, buffer: str | None = None) -> str:
    """Why `rank`'s `quantity` differs from rank 0's at `step`; `buffer`: the first that does."""
    if quantity == "buffer_digest":
        where = ""
        if buffer:
            module = buffer.rpartition(".")[0] or "(model)"
            where = f" (first {buffer}, of module {module})"
        return (
            f"rank {rank} entered step {step}'s forward with other buffers than rank 0{where}: "
            "buffers updated from the local batch and never re-synced across ranks (DDP with "
            "broadcast_buffers=False, a buffer outside the DDP-wrapped module, or no DDP): "
            "keep DDP's default broadcast_buffers=True, or use SyncBatchNorm"
        )
    if quantity == "grad_norm":
        return (
            f"rank {rank}'s gradient norm differs: a gradient that is not averaged over ranks "
            "(a parameter left out of the all-reduce) or a norm computed on a local shard"
        )
    if quantity == "param_digest":
        if step == 1:
            return (
                f"rank {rank}'s parameters differ after step 1 although the averaged gradients "
                "agree: the replicas started from different weights (a rank-dependent seed, "
                "e.g. for dropout or augmentation, set before the model is built, and no "
                "broadcast of the initial parameters)"
            )
        return (
            f"rank {rank}'s parameters departed although the gradient norms agree: an update "
            "that uses rank-local state (optimizer state, a rank-dependent step)"
        )
    return (
        f"rank {rank}'s loss differs while the replicas agreed before the step: its forward "
        "pass saw different inputs or randomness (rank-dependent dropout or augmentation "
        "applied to data every rank shares)"
    )


def _first_departure(trainer: Trainer, steps: int, ranks: int, logged: list[dict]):
    """(step, quantity, rank, rank 0's value, its value, buffer) of the first replica to depart,
    or None; rank 0's records go to `logged`."""
    entering = EnteringBuffers(trainer.engine.module)
    try:
        return _departure(trainer, steps, ranks, logged, entering)
    finally:
        entering.close()


def _departure(trainer, steps, ranks, logged, entering):
    for _ in range(steps):
        m = trainer.train_step()
        mine = {"loss": m.loss, "grad_norm": m.grad_norm,
                "param_digest": digests(trainer.engine.module, gather=True)["param_digest"],
                **entering.take()}  # fmt: skip
        every: list = [None] * ranks
        if dist.is_initialized():
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        logged.append({"step": m.step, "skipped": m.skipped, **every[0]})
        for quantity in REPLICA_QUANTITIES:
            skip = m.skipped and quantity == "grad_norm"
            bad = [r for r in range(1, ranks)
                   if not agrees(every[r].get(quantity), every[0].get(quantity), skipped=skip)]  # fmt: skip
            if bad:
                first, zero = every[bad[0]], every[0]
                return (m.step, quantity, bad[0], zero.get(quantity), first.get(quantity),
                        first_buffer(zero, first))  # fmt: skip
    return None


def first_buffer(want: dict, got: dict) -> str | None:
    """The first buffer whose digest differs between two ranks' lines."""
    a, b = want.get("buffers") or {}, got.get("buffers") or {}
    return next((name for name in a if a[name] != b.get(name)), None)


def check_replicas(cfg: RunConfig, workdir: Path) -> CheckResult:
    """After every step each rank's loss, gradient norm and digests of the parameters and
    buffers it holds (shards left out) equal rank 0's."""
    cfg = without_checkpoints(cfg)
    trainer = Trainer(cfg, workdir / "replicas")
    ranks = world_size()
    logged: list[dict] = []
    try:
        found = _first_departure(trainer, cfg.steps, ranks, logged)
    finally:
        trainer.close()
    bad = unsound("replicas", {"rank 0": logged}, ("loss", "grad_norm"))
    if bad is not None:
        bad.summary = f"{cfg.engine.name}: {bad.summary}"
        return bad
    if found is None:
        return CheckResult(
            "replicas",
            True,
            f"{cfg.engine.name}: {ranks} ranks agree on loss, grad norm and the digests of "
            f"{_digested(logged)} after each of {cfg.steps} steps",
            notes=skipped_notes({"rank 0": logged}),
        )
    step, quantity, rank, want, got, buffer = found
    return CheckResult(
        "replicas",
        False,
        f"{cfg.engine.name}: rank {rank} departed from rank 0 at step {step}: {quantity} "
        f"rank0={want!r} rank{rank}={got!r}",
        divergence=Divergence(step, quantity, want, got),
        diagnosis=replica_departed(quantity, step, rank, buffer),
        rank=rank,
    )


# ------------------------------------------------------------------------------ a script


def check_script(runner: ScriptRunner, asked: Runs) -> CheckResult:
    """One run in which every rank logs its own line; a per-rank local loss is noted and left
    out."""
    nproc, steps = asked.nproc, asked.steps
    if nproc < 2:
        raise UsageError("the replicas check compares ranks: run it with --nproc 2 or more")
    per_rank = runner.run("replicas", nproc=nproc, max_steps=steps, per_rank=True)
    runs = {r: by_step(records) for r, records in per_rank.items()}
    require_steps(per_rank[0], steps, "replicas")
    logged = {f"rank {r}": records for r, records in per_rank.items()}
    bad = runner.unsound("replicas", logged)
    if bad is not None:
        return bad
    present = [q for q in REPLICA_QUANTITIES if any(q in r for r in runs[0].values())]
    if not {"param_digest", "buffer_digest"} & set(present):
        runner.note("no parameter digest logged: pass model=model to lockstep.track.log")
    if "buffer_digest" in present and _digested(per_rank[0]) != "parameters and buffers":
        present.remove("buffer_digest")
        runner.note("the model holds no buffers: buffer_digest covers nothing, not compared")
    if "loss" in present and _local_loss(runs, present):
        runner.note("the logged loss differs per rank from step 1 while the replicas agree: "
                    "each rank logs its local loss; losses left out of the comparison")  # fmt: skip
        present.remove("loss")
    for step in range(1, steps + 1):
        for quantity in present:
            want = runs[0][step].get(quantity)
            for rank in range(1, nproc):
                got = runs[rank].get(step, {}).get(quantity)
                skip = quantity == "grad_norm" and runs[0][step].get("skipped") is True
                if not agrees(got, want, skipped=skip):
                    return CheckResult(
                        "replicas",
                        False,
                        f"rank {rank} departed from rank 0 at step {step}: {quantity} "
                        f"rank0={want!r} rank{rank}={got!r}",
                        divergence=Divergence(step, quantity, want, got),
                        diagnosis=replica_departed(
                            quantity,
                            step,
                            rank,
                            first_buffer(runs[0][step], runs[rank].get(step, {})),
                        ),
                        logs=runner.logs,
                        notes=runner.take_notes(),
                        rank=rank,
                    )
    return CheckResult(
        "replicas",
        True,
        f"{nproc} ranks hold identical replicas ({', '.join(present)}) after each of {steps} steps",
        logs=runner.logs,
        notes=runner.take_notes() + skipped_notes({"rank 0": per_rank[0]}),
    )


def _digested(records: list[dict]) -> str:
    """What the digests covered."""
    buffers = any(r.get("buffer_digest") not in (None, EMPTY_DIGEST) for r in records)
    return "parameters and buffers" if buffers else "parameters (the model holds no buffers)"


def _local_loss(runs: dict[int, dict[int, dict]], present: list[str]) -> bool:
    """The loss differs at step 1 while every other quantity agrees at every step."""
    if all(run.get(1, {}).get("loss") == runs[0][1]["loss"] for run in runs.values()):
        return False
    others = [q for q in present if q != "loss"]
    return bool(others) and all(
        run.get(step, {}).get(q) == record.get(q)
        for run in runs.values()
        for step, record in runs[0].items()
        for q in others
    )
