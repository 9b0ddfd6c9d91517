"""`lockstep fingerprint`, `lockstep diff`, `lockstep preflight`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lockstep.errors import EXIT_FAIL, EXIT_OK, UsageError


def register(subparsers) -> None:
    fp = subparsers.add_parser(
        "fingerprint", help="fingerprint this process's environment (one rank)"
    )
    fp.add_argument("--json", metavar="PATH", help="write the canonical JSON fingerprint here")
    fp.add_argument("--lock", metavar="PATH", help="lock file to compare the packages with")
    fp.set_defaults(func=fingerprint_command)

    diff = subparsers.add_parser("diff", help="fields that differ between two fingerprints")
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    _add_allow(diff)
    diff.set_defaults(func=diff_command)

    pre = subparsers.add_parser(
        "preflight",
        help="check every rank before the real launch (run under any launcher, or --nproc N)",
        description=(
            "Run on every rank: local checks, check-in, fingerprint comparison, collectives "
            "by value, busbw, GPU matmul checksum, and across hosts the link stage (--links). "
            "Exit 0 ok, 1 mismatch, failed check or slow node or link, 2 usage or bad input, "
            "3 timeout or missing ranks; the same on every rank."
        ),
    )
    pre.add_argument(
        "--nproc",
        type=_positive_int,
        metavar="N",
        help="no launcher: start N local ranks through torchrun's launcher API (default 1)",
    )
    multi = pre.add_argument_group(
        "multi-node launch (torchrun's flags; every node first checks in with node 0 at the "
        "endpoint's port + 1, so a node that cannot start is named within --timeout)"
    )
    multi.add_argument(
        "--nnodes", type=_positive_int, metavar="N", help="nodes in the job (one call per node)"
    )
    multi.add_argument(
        "--node-rank", type=_non_negative_int, metavar="K", help="this node's index, 0..N-1"
    )
    multi.add_argument(
        "--nproc-per-node", type=_positive_int, metavar="n", help="ranks on each node (default 1)"
    )
    multi.add_argument(
        "--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and rendezvous port"
    )
    pre.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="seconds to wait for peers at each step (default 60)",
    )
    pre.add_argument("--lock", metavar="PATH", help="lock file every rank must match exactly")
    pre.add_argument("--json", metavar="PATH", help="write rank 0's full report here")
    pre.add_argument(
        "--min-busbw", type=float, metavar="GBPS", help="fail below this all_reduce busbw"
    )
    pre.add_argument(
        "--links",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure point-to-point bandwidth between node pairs and name a slow node or link "
        "(default: on when the ranks span more than one host; --links also between the ranks of "
        "one host). A link whose transfers were all CPU-starved is reported as not judged, "
        "never as slow",
    )
    pre.add_argument(
        "--min-link-gbps",
        type=_positive_float,
        metavar="GBPS",
        help="also fail a link below this many Gb/s (the verdict needs no fixed figure)",
    )
    pre.add_argument(
        "--exclude-out",
        metavar="FILE",
        help="write the nodes to leave out as a Slurm host list (sbatch --exclude=$(cat FILE))",
    )
    pre.add_argument("--plot", metavar="DIR", help="write DIR/links.png, the link heatmap")
    _add_allow(pre)
    pre.set_defaults(func=preflight_command)


def _add_allow(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="FIELD",
        help="also ignore this field (dotted name or glob, e.g. env.NCCL_DEBUG); repeatable",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def fingerprint_command(args) -> int:
    from lockstep.env import fingerprint, localchecks
    from lockstep.env.summary import print_fingerprint

    _writable(args.json)
    fp = fingerprint.collect(lock=_existing(args.lock, "lock file"))
    if args.json:
        fingerprint.dump(fp, Path(args.json))
    shm = localchecks.shm()
    print_fingerprint(fp, warnings=[shm["detail"]] if shm["status"] == "warn" else [])
    return EXIT_OK


def diff_command(args) -> int:
    from lockstep.env import compare, fingerprint
    from lockstep.env.summary import print_diff

    a, b = fingerprint.load(Path(args.a)), fingerprint.load(Path(args.b))
    ignored = compare.Ignored(args.allow)
    fields = compare.differing_fields(a, b, ignored)
    print_diff(fields, args.a, args.b)
    return EXIT_FAIL if fields else EXIT_OK


def preflight_command(args) -> int:
    from lockstep.env import launcher

    _existing(args.lock, "lock file")
    _writable(args.json)
    _writable(args.exclude_out)
    if _multinode(args):
        from lockstep.env.nodes import run_node

        return run_node(args)
    info = launcher.detect()
    if info is None:
        return _run_local(args)
    if args.nproc is not None:
        raise UsageError(
            f"--nproc starts local ranks itself; drop it when running under {info.launcher}"
        )
    from lockstep.env.preflight import run_rank

    return run_rank(info, args)


def _run_local(args) -> int:
    """`--nproc N` local ranks; their flight-recorder dumps in a temporary folder, kept (and
    named on stderr) only when a timeout's report was written there (`lockstep.forensics`)."""
    import shutil
    import tempfile

    from lockstep.launch import run_local_cli

    folder = Path(tempfile.mkdtemp(prefix="lockstep-preflight-")) / "flight-recorder"
    try:
        return run_local_cli(args.nproc or 1, ["preflight", *_rank_argv(args)], forensics=folder)
    finally:
        if not (folder / "report.txt").is_file():
            shutil.rmtree(folder.parent, ignore_errors=True)


_MULTI_FLAGS = ("nnodes", "node_rank", "nproc_per_node", "rdzv_endpoint")


def _multinode(args) -> bool:
    """Whether this is preflight's own multi-node launch: --nnodes given, or a Kubeflow
    Trainer pod's PET_* variables without torchrun (then they are the flags' defaults)."""
    import os

    from lockstep.env import launcher
    from lockstep.env.nodes import from_kubeflow

    given = [f for f in _MULTI_FLAGS if getattr(args, f, None) is not None]
    if args.nnodes is None:
        pet = from_kubeflow()
        if not pet or "RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
            if given:
                flags = ", ".join("--" + f.replace("_", "-") for f in given)
                raise UsageError(f"{flags} belong to a multi-node launch: add --nnodes N")
            return False
        for name, value in pet.items():
            if getattr(args, name) is None:
                setattr(args, name, int(value) if name != "rdzv_endpoint" else value)
    try:
        info = launcher.detect()
    except UsageError:
        info = None  # e.g. a PyTorchJob's RANK/WORLD_SIZE: the flags say what this launch is
    if info is not None and info.launcher != "manual":
        raise UsageError(
            f"--nnodes starts torchrun's agent itself; drop it when running under {info.launcher}"
        )
    if args.nproc is not None:
        raise UsageError("--nproc is for one node; with --nnodes give --nproc-per-node")
    missing = [f for f in ("node_rank", "rdzv_endpoint") if getattr(args, f) is None]
    if missing:
        raise UsageError(
            f"--nnodes {args.nnodes} needs {' and '.join('--' + f.replace('_', '-') for f in missing)}"
        )
    if args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}")
    from lockstep.env.nodes import parse_endpoint

    parse_endpoint(args.rdzv_endpoint)
    if args.nproc_per_node is None:
        args.nproc_per_node = 1
    return True


def _rank_argv(args) -> list[str]:
    """The options each embedded rank gets (all but --nproc)."""
    argv = ["--timeout", str(args.timeout)]
    for flag, value in (
        ("--lock", args.lock),
        ("--json", args.json),
        ("--min-busbw", args.min_busbw),
        ("--min-link-gbps", args.min_link_gbps),
        ("--exclude-out", args.exclude_out),
        ("--plot", args.plot),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.links is not None:
        argv.append("--links" if args.links else "--no-links")
    for field in args.allow:
        argv += ["--allow", field]
    return argv


def _existing(path: str | None, what: str) -> Path | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise UsageError(f"{what} {path} does not exist")
    return Path(path)


def _writable(path: str | None) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise UsageError(f"cannot write {path}: its folder does not exist")
