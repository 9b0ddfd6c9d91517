"""A training script that speaks lockstep's black-box protocol (docs/scripts.md)."""

import random

import torch
import torch.distributed as dist

from lockstep import track

proto = track.protocol()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GLOBAL_BATCH, MAX_NORM = 16, 0.5
DATA = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))

torch.manual_seed(0)  # one stream on every rank: the init, then the per-step input noise
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
step, position = 0, 0  # optimizer steps taken, samples consumed
ckpt = proto.checkpoint_dir / "state.pt" if proto.checkpoint_dir else None
if proto.resume and ckpt and ckpt.exists():
    state = torch.load(ckpt, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    torch.set_rng_state(state["rng"])
    step, position = state["step"], state["position"]


def save():  # every rank holds the same state: rank 0 saves it, atomically
    if ckpt and rank == 0:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        state.update(rng=torch.get_rng_state(), step=step, position=position)
        torch.save(state, ckpt.with_suffix(".tmp"))
        ckpt.with_suffix(".tmp").replace(ckpt)


while step < (proto.max_steps or 20):
    epoch, offset = divmod(position, len(DATA))
    order = random.Random(epoch).sample(range(len(DATA)), len(DATA))
    x = DATA[order[offset : offset + GLOBAL_BATCH]]
    x = (x + 0.05 * torch.randn_like(x))[rank::world]  # noise from the RNG; this rank's share
    loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():  # average the gradient over ranks (what DDP does)
        dist.all_reduce(p.grad)
        p.grad /= world
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    lr = sched.get_last_lr()[0]
    opt.step()
    sched.step()
    step, position = step + 1, position + GLOBAL_BATCH
    dist.all_reduce(loss := loss.detach())
    track.log(step, loss=loss / world, grad_norm=grad_norm, lr=lr, model=model)

save()
track.finish()  # barrier, destroy_process_group, exit without gloo's abort at exit
