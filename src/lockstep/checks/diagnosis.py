"""The diagnosis wording the checks share, whichever side found it (`harness.py` on the
reference job, `script.py` on a user's script): one sentence a result's "likely cause" shows.
"""

from __future__ import annotations

# What the replicas check compares across ranks after each step, in the order a step
# computes them: the first that differs says what departed.
REPLICA_QUANTITIES = ("loss", "grad_norm", "param_digest", "buffer_digest")


def replica_departed(quantity: str, step: int, rank: int) -> str:
    """Why `rank`'s `quantity` differs from rank 0's after `step` (replicas check)."""
    if quantity == "buffer_digest":
        return (
            f"rank {rank}'s buffers differ from rank 0's while its parameters agree: a buffer "
            "updated from the local batch and never broadcast or averaged (BatchNorm running "
            "statistics: use SyncBatchNorm, or DDP's broadcast_buffers)"
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
