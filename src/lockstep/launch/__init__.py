"""Starting ranks on this machine through torchrun's launcher API, and nothing left behind.

Exports are imported at first use: importing the package starts no launch machinery.
Design: docs/design/launch.md
"""

import importlib

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
