"""`ExportError`: a model that cannot be exported or failed its own proof (exit 1,
one line on stderr). Bad input is `zoo.cli.UsageError` (exit 2), as in every CLI."""


class ExportError(RuntimeError):
    """The model could not be exported, or the export did not match Keras."""
