"""The `lockstep` command: a thin argparse front over each command group's `register(subparsers)`,
whose commands import torch only when they run (docs/design/options.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lockstep import __version__
from lockstep.errors import EXIT_USAGE, LockstepError

# Modules that add subcommands, in the order a user walks the pipeline.
COMMAND_MODULES = [
    "lockstep.env.cli",
    "lockstep.preflight.cli",
    "lockstep.train.cli",
    "lockstep.checks.cli",
    "lockstep.gate.cli",
    "lockstep.forensics.cli",
]


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line (its default already does; keep the usage short)."""

    def error(self, message: str):  # pragma: no cover - exercised through the CLI tests
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lockstep",
        description="Reproducibility and CI for distributed PyTorch, FSDP and DeepSpeed training.",
    )
    parser.add_argument("--version", action="version", version=f"lockstep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def take_local_rank(argv: list[str]) -> list[str]:
    """Drop the `--local_rank=N` the deepspeed launcher appends, keeping it as LOCAL_RANK."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--local_rank", "--local-rank"):
            if not eq and i + 1 < len(argv):
                i, value = i + 1, argv[i + 1]
            os.environ.setdefault("LOCAL_RANK", value)
        else:
            out.append(arg)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(take_local_rank(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except LockstepError as err:
        from lockstep.redact import scrub_text

        print(f"lockstep: error: {scrub_text(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("lockstep: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug, or a library's error: its traceback, redacted (exit 1, as Python)
        import traceback

        from lockstep.redact import scrub_text

        print(scrub_text(traceback.format_exc()).rstrip(), file=sys.stderr)
        return 1


def console() -> int:
    """The `lockstep` command and `python -m lockstep`: `main`, leaving without Python's last
    garbage collection over torch's objects (docs/design/options.md). Not for `main` called in
    a process that goes on."""
    import atexit
    import gc

    atexit.register(gc.freeze)
    return main()


if __name__ == "__main__":
    raise SystemExit(console())
