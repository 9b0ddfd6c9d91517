"""A user's script whose ranks start helper interpreters (no lockstep import):
`python helpers.py MODE ODD`.

Every rank all_reduces, then starts two helpers as new interpreters, which inherit the rank's
environment (lockstep's sitecustomize included): one imports torch and exits once its rank
has dumped, as a dataloader worker spawned fresh ends after its rank; the other crashes at
once. Then the real fault: crash: rank ODD raises where the others all_gather (#2); hang:
rank ODD broadcasts where the others all_gather (#2)."""

import os
import subprocess
import sys

import torch
import torch.distributed as dist

LATE = """
import os, sys, time
import torch, torch.distributed
parent, deadline = os.getppid(), time.monotonic() + 60
done = os.path.join(os.environ["LOCKSTEP_FR_DIR"], "rank_%s.stacks" % os.environ["RANK"])
while not os.path.exists(done) and os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
"""

mode, odd = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4)
dist.all_reduce(t)
late = subprocess.Popen([sys.executable, "-c", LATE])
crashed = subprocess.run([sys.executable, "-c", "raise RuntimeError('a helper crashed')"])
assert crashed.returncode == 1
out = [torch.zeros(4) for _ in range(world)]
if rank == odd and mode == "crash":
    raise RuntimeError(f"the real crash on rank {rank}")
if rank == odd:
    dist.broadcast(t, 0)
else:
    dist.all_gather(out, t)
late.wait()
print(f"rank {rank} pid {os.getpid()} done", flush=True)
dist.destroy_process_group()
