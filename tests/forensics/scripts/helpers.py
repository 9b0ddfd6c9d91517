"""A user's script whose ranks start helper interpreters (no lockstep import):
`python helpers.py MODE ODD [DIR]`.

Every rank all_reduces, then starts two helpers as new interpreters, which inherit the rank's
environment (lockstep's sitecustomize included): one crashes at once; a second later the other
imports torch and exits once its rank has dumped, as a dataloader worker spawned fresh ends
after its rank. Then the real fault: crash: rank ODD raises once the others wait in all_gather #2
(they say so in DIR); hang: rank ODD broadcasts where the others all_gather (#2)."""

import os
import subprocess
import sys
import time

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
entered = os.path.join(sys.argv[3], "entered") if mode == "crash" else ""
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4)
dist.all_reduce(t)
crashed = subprocess.run([sys.executable, "-c", "raise RuntimeError('a helper crashed')"])
assert crashed.returncode == 1
time.sleep(1)  # a dump asked for now would be taken before the fault (lockstep polls at 5 Hz)
late = subprocess.Popen([sys.executable, "-c", LATE])
out = [torch.zeros(4) for _ in range(world)]
if mode == "crash" and rank == odd:
    deadline = time.monotonic() + 60
    while not os.path.exists(entered) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError(f"the real crash on rank {rank}")
if mode == "crash":
    work = dist.all_gather(out, t, async_op=True)  # recorded: it waits in it
    open(entered, "w").close()
    work.wait()
elif rank == odd:
    dist.broadcast(t, 0)
else:
    dist.all_gather(out, t)
late.wait()
print(f"rank {rank} pid {os.getpid()} done", flush=True)
dist.destroy_process_group()
