"""Start N ranks on this machine through torchrun's launcher API, as `torchrun --standalone`
does, in this process: a c10d rendezvous on the loopback with a port the OS picks, no restarts.

- `run_local`: a function on each rank (`train --nproc N`, `check NAME CONFIG`);
- `run_local_cli`: `python -m lockstep ...` on each rank (`preflight --nproc N`);
- `run_command`: a user's script or a job whose code comes from elsewhere (`check --script`,
  `gate`), every rank's output into one redacted log, with a timeout;
- `run_launcher`: another launcher's command (the deepspeed launcher) in its own process group.

`rank_environment` sets what ranks need before torch and DeepSpeed start. Which launcher
started *this* process is `detect` (`detect()`, `adopt()`).

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
- `detect`: which launcher started this process and this rank's place in the job, the one
  reader of launcher variables (torchrun, srun, mpirun, PMI, Kubeflow);
- `hostlist`: Slurm host lists both ways (`expand`, `compress`).

What code outside this package uses is exported here, imported at first use: `lockstep
fingerprint` reads `detect`'s variable tables, and importing this package must not start the
launch machinery (subprocess, multiprocessing, signal handling) for it.
"""

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    "die_with": "cleanup",
    "signals_deferred": "cleanup",
    "signals_raise": "cleanup",
    "owned_tempdir": "cleanup",
    "orphaned_tempdirs": "cleanup",
    "ABORT_SIGNATURE": "forensics",
    "aborted_at_exit": "forensics",
    "last_error_line": "forensics",
    "forkserver_context": "forkserver",
    "free_port": "ranks",
    "rank_environment": "ranks",
    "run_command": "ranks",
    "run_launcher": "ranks",
    "run_local": "ranks",
    "run_local_cli": "ranks",
}

__all__ = sorted(_EXPORTS, key=str.lower)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
