"""A torchvision-style CNN (conv, BatchNorm, ReLU, dropout, a linear head) trained under DDP
on made-up images, speaking lockstep's protocol; flags plant what the model-aware verdicts
must tell apart:

    --bn / --dropout / --functional-dropout   the model holds BatchNorm / nn.Dropout /
                                              F.dropout in its forward
    --bn-no-stats        BatchNorm with track_running_stats=False (nothing to freeze)
    --no-broadcast       DDP(broadcast_buffers=False)
    --no-ddp             gradients averaged by hand: nothing syncs the buffers
    --inner              log the module inside the DDP wrapper, not the wrapper
    --lr X               the learning rate (0: never updates)
    --no-step            optimizer.step() removed
    --sum-loss           a loss summed over the local batch (a world-size bug)
    --no-protocol        track.protocol() never called (the hooks start at the first log)
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lockstep import track

flags = sys.argv[1:]
lr = float(flags[flags.index("--lr") + 1]) if "--lr" in flags else 0.05
proto = track.protocol() if "--no-protocol" not in flags else None
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GLOBAL_BATCH = 16
gen = torch.Generator().manual_seed(0)
IMAGES = torch.randn(128, 3, 8, 8, generator=gen)
LABELS = (IMAGES.mean((1, 2, 3)) > 0).long() + 2 * (IMAGES[:, 0].mean((1, 2)) > 0).long()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias="--bn" not in flags)
        stats = "--bn-no-stats" not in flags
        self.bn1 = nn.BatchNorm2d(8, track_running_stats=stats) if "--bn" in flags else None
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.drop = nn.Dropout(0.25) if "--dropout" in flags else None
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(self.bn1(x) if self.bn1 is not None else x)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        if self.drop is not None:
            x = self.drop(x)
        if "--functional-dropout" in flags:
            x = F.dropout(x, 0.2, self.training)
        return self.fc(x)


torch.manual_seed(0)
net = Net()
if "--no-ddp" in flags:
    model = net
    for p in net.parameters():  # the same initial weights on every rank
        dist.broadcast(p.data, 0)
else:
    model = nn.parallel.DistributedDataParallel(
        net, broadcast_buffers="--no-broadcast" not in flags
    )
opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
torch.manual_seed(1 + rank)  # dropout masks differ per rank, as in any DDP job
max_steps = proto.max_steps if proto and proto.max_steps else 8
for step in range(1, max_steps + 1):
    start = (step - 1) * GLOBAL_BATCH % len(IMAGES)
    x = IMAGES[start : start + GLOBAL_BATCH][rank::world]
    y = LABELS[start : start + GLOBAL_BATCH][rank::world]
    out = model(x)
    loss = F.cross_entropy(out, y, reduction="sum" if "--sum-loss" in flags else "mean")
    opt.zero_grad()
    loss.backward()
    if "--no-ddp" in flags:
        for p in net.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    if "--no-step" not in flags:
        opt.step()
    dist.all_reduce(loss := loss.detach())
    logged = net if "--inner" in flags else model
    track.log(step, loss=loss / world, grad_norm=grad_norm, lr=lr, model=logged)
track.finish()
