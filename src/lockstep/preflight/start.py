"""Which launch one call of `lockstep preflight` is, and its start: one node of preflight's own
multi-node launch (`--nnodes`, `nodes.run_node`), one rank under an outer launcher (torchrun,
srun, mpirun, ...: `rank.run_rank`), or, with no launcher, `--nproc N` local ranks started
here through torchrun's launcher API, each running `lockstep preflight` as under torchrun
(with a job key made here when the operator set none: `job_key.local_key`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lockstep.errors import UsageError
from lockstep.launch import detect
from lockstep.preflight import job_key
from lockstep.preflight.options import Options


def run(options: Options) -> int:
    """The exit code every rank agrees on."""
    if options.multinode is not None:
        from lockstep.preflight import nodes

        return nodes.run_node(options)
    info = detect.detect()
    if info is None:
        return run_local(options)
    if options.nproc is not None:
        raise UsageError(
            f"--nproc starts local ranks itself; drop it when running under {info.launcher}"
        )
    from lockstep.preflight import rank

    return rank.run_rank(info, options)


def run_local(options: Options) -> int:
    """`--nproc N` local ranks; their flight-recorder dumps in a temporary folder, kept (and
    named on stderr) only when a timeout's report was written there (`lockstep.forensics`)."""
    from lockstep.launch import run_local_cli

    job_key.load()  # the operator's key, if any, checked before any rank starts
    folder = Path(tempfile.mkdtemp(prefix="lockstep-preflight-")) / "flight-recorder"
    try:
        with job_key.local_key():  # else one made here: every rank is on this host
            return run_local_cli(
                options.nproc or 1, ["preflight", *options.rank_argv()], forensics=folder
            )
    finally:
        if not (folder / "report.txt").is_file():
            shutil.rmtree(folder.parent, ignore_errors=True)
