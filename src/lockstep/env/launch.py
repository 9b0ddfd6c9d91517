"""The embedded default: with no launcher, start N local ranks through torchrun's launcher API.

Same machinery as `torchrun --standalone`: a c10d rendezvous on 127.0.0.1 with a port the OS
picks, no restarts. Each rank runs `python -m lockstep preflight` and exits with the code rank 0
decided, so the launcher's code is theirs.
"""

from __future__ import annotations

import logging
import sys

from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE
from lockstep.local_ranks import standalone_config


def launch_local(nproc: int, rank_argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    # The agent's own INFO/WARNING lines (and its failure dump) repeat what rank 0 prints.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = standalone_config(nproc, "preflight")
    try:
        elastic_launch(config, sys.executable)("-m", "lockstep", "preflight", *rank_argv)
    except ChildFailedError as err:
        codes = {f.exitcode for f in err.failures.values()}
        # Ranks agree on their code; a rank killed by a signal is a missing rank.
        return max(codes) if codes <= {EXIT_FAIL, EXIT_USAGE, EXIT_TIMEOUT} else EXIT_TIMEOUT
    return EXIT_OK
