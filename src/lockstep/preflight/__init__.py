"""`lockstep preflight`: every rank checked before the real launch.

- `cli`: the flags (argparse), parsed once into `options.Options`;
- `options`: what one call was asked to do, the Kubeflow defaults, the ranks' own argv;
- `start`: which launch a call is (a node of `--nnodes`, a rank under a launcher, `--nproc N`);
- `nodes`, `node_verdict`: the multi-node check-in before torchrun's rendezvous, and its
  verdict (plain data);
- `rank`: the per-rank protocol (check-in, fingerprints, collectives, links, the verdict);
- `store`: the one way to the c10d store (connect, read and write, poll with a deadline, the
  check-in);
- `local`: the local checks, a registry (one module and one row per check);
- `collectives`: collectives checked by value, busbw, the GPU matmul checksum;
- `verdict`: the report from what rank 0 gathered (plain data); `report`: the table, the JSON
  and the GitHub step summary; `lines`: rank ranges and error lines;
- `links`: the link stage (measure, schedule, verdict, plot).
"""
