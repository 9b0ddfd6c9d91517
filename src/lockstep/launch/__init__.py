"""Start N ranks on this machine through torchrun's launcher API, as `torchrun --standalone`
does, in this process: a c10d rendezvous on the loopback with a port the OS picks, no restarts.

- `run_local`: a function on each rank (`train --nproc N`, `check NAME CONFIG`);
- `run_local_cli`: `python -m lockstep ...` on each rank (`preflight --nproc N`);
- `run_command`: a user's script or a job whose code comes from elsewhere (`check --script`,
  `gate`), every rank's output into one redacted log, with a timeout;
- `run_launcher`: another launcher's command (the deepspeed launcher) in its own process group.

`rank_environment` sets what ranks need before torch and DeepSpeed start. Which launcher
started *this* process is `lockstep.env.launcher`.

The modules, one concern each:

- `ranks`: the launch functions above;
- `forkserver`: CPU ranks forked from a server that imported torch once (`forkserver_context`),
  and how a forked rank takes on the launching process's environment; `gc_freeze`, the
  server's last preload, freezes its heap;
- `cleanup`: nothing outlives a launch (signal handlers, torchelastic's folder, ranks and
  process groups that die with this process);
- `forensics`: reading a launch's log (`aborted_at_exit`, `last_error_line`);
- `script`: a user's script command under the protocol, its launchers (`LAUNCHERS`) and a
  launch's exit triaged; `protocol_run`: one run of it in a folder of its own, read back (the
  one way `check --script` and `gate` run a script).

What code outside this package uses is exported here.
"""

from lockstep.launch.cleanup import die_with, signals_deferred, signals_raise
from lockstep.launch.forensics import ABORT_SIGNATURE, aborted_at_exit, last_error_line
from lockstep.launch.forkserver import forkserver_context
from lockstep.launch.ranks import (
    free_port,
    rank_environment,
    run_command,
    run_launcher,
    run_local,
    run_local_cli,
)

__all__ = [
    "ABORT_SIGNATURE",
    "aborted_at_exit",
    "die_with",
    "forkserver_context",
    "free_port",
    "last_error_line",
    "rank_environment",
    "run_command",
    "run_launcher",
    "run_local",
    "run_local_cli",
    "signals_deferred",
    "signals_raise",
]
