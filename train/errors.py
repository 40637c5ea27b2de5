"""Errors and exit codes shared by the training CLIs.

A `UsageError` is the user's fault (bad flag, missing or malformed file): the CLI prints
one line on stderr and exits 2. Anything else is a bug or an environment problem: exit 1
with a short message, and the traceback only under --debug.
"""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; the message names the problem and the offending value."""


class DataError(UsageError):
    """A data file or data set that cannot be used (missing, malformed, empty)."""
