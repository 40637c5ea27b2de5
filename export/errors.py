"""Error types that the CLI maps to exit codes.

`UsageError` is bad input from the user (exit 2, one line on stderr);
`ExportError` is a model that cannot be exported or failed its own proof
(exit 1, one line on stderr). Anything else is a bug (exit 1, traceback
only under --debug).
"""


class UsageError(ValueError):
    """Bad input: missing path, unknown kind or option, target in the way."""


class ExportError(RuntimeError):
    """The model could not be exported, or the export did not match Keras."""
