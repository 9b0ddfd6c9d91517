"""Training invariant checks: determinism, resume, clipping, equivalence and more.

- `registry`: every check by name (`CHECKS`), what it catches and which functions run it;
- one file per check, named for it (`determinism`, `resume`, `clip`, `equivalence`,
  `world_size`, `accumulation`, `replicas`, `elastic`): its rank-side function on lockstep's
  reference job, its `plan` where it needs launches of its own, its `check_script` on a
  user's script;
- what they share: `harness` (configs, tolerances, a run's trajectory), `agreement` (runs that
  must agree), `reference` (the unsharded reference), `state` (training state compared),
  `trajectory` (per-step metrics compared), `divergence` and `divergence_replay` (where two
  runs part, after a failure), `script_runs` (a user's script run for the checks), `result`;
- running them: `plans` (what `lockstep check` asks, launched), `harness_ranks` (a launch's
  ranks), `cli`.
"""
