"""Errors that end a command with a one-line message and its exit code, the same for every
command: 0 ok, 1 a failure found, 2 bad input, 3 timeout or missing ranks, 4 not judged.
"""

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_NOT_JUDGED = 4


class LockstepError(Exception):
    """A failure the user can act on; `str(err)` is the one-line message."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LockstepError):
    """Bad input: a config, a file, launcher variables."""

    exit_code = EXIT_USAGE


class CheckFailed(LockstepError):
    """A check ran and found a mismatch."""

    exit_code = EXIT_FAIL


class RankTimeout(LockstepError):
    """Peers did not answer in time."""

    exit_code = EXIT_TIMEOUT
