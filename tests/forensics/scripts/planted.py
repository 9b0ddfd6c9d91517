"""A user's script with a planted fault (no lockstep import): `python planted.py MODE ODD`.

hang: rank ODD calls broadcast where the others all_gather (they block in gloo);
python: after all_reduce, all_gather, all_reduce, all_gather, rank ODD blocks in Python
where the others all_reduce (#5);
size: rank ODD all_reduces 8 floats where the others 4 (gloo aborts or lets it through);
skip: after all_reduce, all_gather, all_reduce, all_gather, rank ODD skips all_reduce #5 and
enters the all_gather after it (as the others' history predicts) while the others all_reduce;
small: rank ODD all_reduces 2 floats where the others 4;
jobdump DIR: after all_reduce, all_gather, all_reduce, all_gather, rank ODD starts an
all_gather where the others an all_reduce (not waited for), and every rank writes its own
flight-recorder dump to DIR, as a cluster job would;
plant DUMP: first a FIFO named rank_7.stacks and the file DUMP as rank_9 in the folder lockstep
reads the dumps from, then as hang."""

import os
import sys
import time

import torch
import torch.distributed as dist

mode, odd = sys.argv[1], int(sys.argv[2])
if mode == "plant":
    folder, mode = os.environ["LOCKSTEP_FR_DIR"], "hang"
    if os.environ["RANK"] == "0":
        os.mkfifo(os.path.join(folder, "rank_7.stacks"))
        with open(sys.argv[3], "rb") as dump, open(os.path.join(folder, "rank_9"), "wb") as out:
            out.write(dump.read())
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4)
dist.all_reduce(t)
if mode == "hang":
    if rank == odd:
        dist.broadcast(t, 0)
    else:
        dist.all_gather([torch.zeros(4) for _ in range(world)], t)
elif mode == "python":
    out = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(out, t), dist.all_reduce(t), dist.all_gather(out, t)
    if rank == odd:
        while True:  # blocked in Python, no collective pending
            time.sleep(3600)
    dist.all_reduce(t)
elif mode == "skip":
    out = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(out, t), dist.all_reduce(t), dist.all_gather(out, t)
    if rank != odd:
        dist.all_reduce(t)
    dist.all_gather(out, t)
elif mode in ("size", "small"):
    theirs = 8 if mode == "size" else 2
    dist.all_reduce(torch.ones(theirs if rank == odd else 4))
else:
    out = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(out, t), dist.all_reduce(t), dist.all_gather(out, t)
    if rank == odd:
        dist.all_gather([torch.zeros(4) for _ in range(world)], t, async_op=True)
    else:
        dist.all_reduce(t, async_op=True)
    with open(os.path.join(sys.argv[3], f"nccl_trace_rank_{rank}"), "wb") as out:
        out.write(torch._C._distributed_c10d._dump_fr_trace())
    sys.stdout.flush()
    os._exit(0)
dist.destroy_process_group()
