"""Errors that end a command with a one-line message and a documented exit code.

Exit codes, the same for every command: 0 ok, 1 a check found a mismatch or failure,
2 usage or bad input (config, file, launcher variables), 3 timeout or missing ranks,
4 not judged: a check or gate that could not decide (it says why; never printed as PASS).
"""

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_NOT_JUDGED = 4


class LockstepError(Exception):
    """A failure the user can act on; `str(err)` is the whole message, one line."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LockstepError):
    """Bad input: a malformed config, a missing file, half-set launcher variables."""

    exit_code = EXIT_USAGE


class CheckFailed(LockstepError):
    """A check ran and found a mismatch."""

    exit_code = EXIT_FAIL


class RankTimeout(LockstepError):
    """Peers did not answer in time; the message names them."""

    exit_code = EXIT_TIMEOUT
