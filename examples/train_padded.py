"""Padded variable-length sequences, the loss normalised by the global token count (correct:
the same on any world size). `--per-rank-mean` averages each rank's mean instead, which
depends on how the tokens fall across ranks: `lockstep check world-size` names it
(docs/forensics.md)."""

import sys

import torch
import torch.distributed as dist

from lockstep import track

proto = track.protocol()  # first: in a float64 replay this makes float64 the default dtype
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
PER_RANK_MEAN = "--per-rank-mean" in sys.argv
GLOBAL_BATCH, SEQ, VOCAB = 8, 16, 32

gen = torch.Generator().manual_seed(0)
TOKENS = torch.randint(1, VOCAB, (512, SEQ), generator=gen)
LENGTHS = torch.randint(3, SEQ + 1, (512,), generator=gen)  # padding after each length
MASK = torch.arange(SEQ)[None, :] < LENGTHS[:, None]

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Embedding(VOCAB, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
    torch.nn.Linear(32, VOCAB),
)  # fmt: skip
opt = torch.optim.AdamW(model.parameters(), lr=0.01)

step = 0
while step < (proto.max_steps or 20):
    rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    x, mask = TOKENS[rows][rank::world], MASK[rows][rank::world]
    logits = model(x[:, :-1])
    target, keep = x[:, 1:], mask[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), target.reshape(-1), reduction="none"
    )
    summed = (token_loss * keep.reshape(-1)).sum()
    if PER_RANK_MEAN:  # the bug: each rank's own mean, averaged over ranks below
        loss = summed / keep.sum()
        scale = 1.0 / world
    else:  # the global token count, summed over ranks
        count = keep.sum().to(summed.dtype)
        dist.all_reduce(count)
        loss = summed / count
        scale = 1.0
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad *= scale
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    step += 1
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    track.log(step, loss=logged * scale, grad_norm=grad_norm, lr=0.01)

track.finish()
