"""`lockstep preflight`: its flags, parsed once into `options.Options` (the work is `start`'s)."""

from __future__ import annotations

import argparse

from lockstep.env.cli import add_allow
from lockstep.inputs import non_negative_int, positive_float, positive_int, seconds

DESCRIPTION = (
    "Run on every rank: local checks, check-in, fingerprint comparison, collectives "
    "by value, busbw, GPU matmul checksum, and across hosts the link stage (--links). "
    "Exit 0 ok, 1 mismatch, failed check or slow node or link, 2 usage or bad input, "
    "3 timeout or missing ranks; the same on every rank."
)


def register(subparsers) -> None:
    pre = subparsers.add_parser(
        "preflight",
        help="check every rank before the real launch (run under any launcher, or --nproc N)",
        description=DESCRIPTION,
    )
    pre.add_argument(
        "--nproc",
        type=positive_int,
        metavar="N",
        help="no launcher: start N local ranks through torchrun's launcher API (default 1)",
    )
    _add_multinode(pre)
    pre.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        metavar="S",
        help="seconds to wait for peers at each step (default 60)",
    )
    pre.add_argument("--lock", metavar="PATH", help="lock file every rank must match exactly")
    pre.add_argument("--json", metavar="PATH", help="write rank 0's full report here")
    pre.add_argument(
        "--min-busbw", type=float, metavar="GBPS", help="fail below this all_reduce busbw"
    )
    _add_links(pre)
    pre.add_argument(
        "--require-key",
        action="store_true",
        help="exit 2 when no job key is set (LOCKSTEP_JOB_KEY or LOCKSTEP_JOB_KEY_FILE); without "
        "one, ranks on several hosts run unauthenticated and the verdict says UNAUTHENTICATED",
    )
    add_allow(pre)
    pre.set_defaults(func=_preflight)


def _add_multinode(parser: argparse.ArgumentParser) -> None:
    multi = parser.add_argument_group(
        "multi-node launch (torchrun's flags; every node first checks in with node 0 at the "
        "endpoint's port + 1, so a node that cannot start is named within --timeout)"
    )
    multi.add_argument(
        "--nnodes", type=positive_int, metavar="N", help="nodes in the job (one call per node)"
    )
    multi.add_argument(
        "--node-rank", type=non_negative_int, metavar="K", help="this node's index, 0..N-1"
    )
    multi.add_argument(
        "--nproc-per-node", type=positive_int, metavar="n", help="ranks on each node (default 1)"
    )
    multi.add_argument(
        "--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and rendezvous port"
    )


def _add_links(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--links",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure point-to-point bandwidth between node pairs and name a slow node or link "
        "(default: on when the ranks span more than one host; --links also between the ranks of "
        "one host). A link whose transfers were all CPU-starved is reported as not judged, "
        "never as slow",
    )
    parser.add_argument(
        "--min-link-gbps",
        type=positive_float,
        metavar="GBPS",
        help="also fail a link below this many Gb/s (the verdict needs no fixed figure)",
    )
    parser.add_argument(
        "--exclude-out",
        metavar="FILE",
        help="write the nodes to leave out as a Slurm host list (sbatch --exclude=$(cat FILE))",
    )
    parser.add_argument("--plot", metavar="DIR", help="write DIR/links.png, the link heatmap")


def _preflight(args: argparse.Namespace) -> int:
    from lockstep.preflight import start
    from lockstep.preflight.options import Options

    options = Options.from_flags(
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        timeout=args.timeout,
        lock=args.lock,
        json=args.json,
        min_busbw=args.min_busbw,
        links=args.links,
        min_link_gbps=args.min_link_gbps,
        exclude_out=args.exclude_out,
        plot=args.plot,
        allow=args.allow,
        require_key=args.require_key,
    )
    return start.run(options)
