"""A black-box training script for the gate tests: 2 gloo ranks, the protocol of
`lockstep.track`, and planted changes chosen by GATE_PLANT (lr, init, data, slow, leak; nan: the loss
NaN from step 4, as an exploding run; abort-exit and abort-mid: libstdc++'s
std::terminate after the run, as gloo's abort at interpreter exit, or after step 2).

Each step sleeps a fixed 0.15 s besides its small compute, as a GPU-bound step waits on its
kernels: step times then hold still on a busy machine, so the speed gate's planted 30% stays
far from the noise.
"""

import ctypes
import os
import random
import time

import torch
import torch.distributed as dist

from lockstep import track

plant = os.environ.get("GATE_PLANT", "")
proto = track.protocol()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
DATA = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
TERMINATE = ctypes.cast(ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev, ctypes.c_void_p)
STEP_S = 0.15 * (1.3 if plant == "slow" else 1.0)

torch.manual_seed(1 if plant == "init" else 0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.06 if plant == "lr" else 0.05)
order = random.Random(1 if plant == "data" else 0).sample(range(len(DATA)), len(DATA))
kept = []
for step in range(1, (proto.max_steps or 6) + 1):
    start = time.perf_counter()
    idx = order[(step - 1) * 16 : step * 16]
    x = DATA[idx][rank::world]
    loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    if plant == "leak":  # 40 MiB more resident memory every step, never freed
        kept.append(torch.ones(10 * 2**20))
    time.sleep(max(0.0, STEP_S - (time.perf_counter() - start)))
    dist.all_reduce(loss := loss.detach())
    if plant == "nan" and step >= 4:
        loss = loss * float("nan")
    track.log(step, loss=loss / world, lr=opt.param_groups[0]["lr"])
    if plant == "abort-mid" and step == 2:
        ctypes.CFUNCTYPE(None)(TERMINATE.value)()
if plant == "abort-exit":  # a C atexit handler: runs after Python's finalization, no frame
    dist.barrier()
    dist.destroy_process_group()
    ctypes.CDLL(None).__cxa_atexit(TERMINATE, None, None)
else:
    track.finish()
