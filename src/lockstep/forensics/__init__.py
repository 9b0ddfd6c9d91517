"""Forensics of a hung or crashed distributed run, from torch's flight recorder.

- `recorder`: in a rank, a daemon thread that dumps the flight recorder (and every thread's
  Python stack) into a folder lockstep owns when lockstep asks, and on an uncaught exception;
  `site/sitecustomize.py` installs it in a user's script started as a new interpreter;
- `collect`: the launching side: the ranks' environment, asking live ranks for their dumps;
- `dumps`: reading dumps back (I/O), with `unpickle` (a bounded restricted unpickler, its
  `opcodes`) and within `bounds` (what a folder of dumps may take: memory, time, nesting, ...);
- `analysis`: who is out of step, per process group and sequence number (pure);
- `hang`: the report on a folder, read and analysed by `reader` in a fresh interpreter of its
  own under RLIMIT_AS and RLIMIT_CPU (no torch, no numpy);
- `cli`: `lockstep forensics hang DIR [--json]` for dumps a job wrote itself.
"""
