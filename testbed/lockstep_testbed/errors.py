"""What goes wrong on the bed: one error type for every module of the package, the node named."""

from __future__ import annotations


class BedError(RuntimeError):
    """The bed could not be built, or a command on it failed; the message names the node."""


class NodeTimeout(BedError):
    """A command on a node did not finish in time (its process tree was killed)."""
