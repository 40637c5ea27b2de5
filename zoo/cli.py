"""What every command line shares (python -m train / export / zoo.*): the error
types and exit codes, the error boundary, input checks, quiet imports.

A `UsageError` is the user's fault (bad flag, missing or malformed file): one line
on stderr naming the problem and the value, exit 2. Anything else is a bug or an
environment problem: exit 1 with a short message, the traceback only with --debug.
"""

import argparse
import contextlib
import json
import os
import sys

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(ValueError):
    """Bad input from the user: the message names the problem and the offending value;
    every CLI prints it as one line on stderr and exits 2 (EXIT_USAGE)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a `UsageError` (one line, exit 2: no usage
    block); --help still prints and exits 0."""

    def error(self, message):
        raise UsageError(message)


class DataError(UsageError):
    """A data file or data set that cannot be used (missing, malformed, empty)."""


def read_sidecar(path, kind):
    sidecar = path + ".json"
    if not os.path.isfile(sidecar):
        raise UsageError(f"missing sidecar vocabulary file for the TFLite model: {sidecar}")
    try:
        with open(sidecar, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"unreadable sidecar file {sidecar}: {e}") from None
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        found = meta.get("kind") if isinstance(meta, dict) else None
        raise UsageError(f"{sidecar}: kind is {found!r}, not {kind!r}")
    return meta


def check_utf8(texts, what="argument"):
    """Command-line text that is not valid UTF-8 arrives with lone surrogates."""
    for i, text in enumerate(texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UsageError(
                f"{what} {i} is not valid UTF-8 text (byte {e.start}): {text!r}"
            ) from None


def cli_boundary(body, argv=None):
    """Runs a CLI's `body()` and applies the project's error contract: a
    `UsageError` is one stderr line and exit 2; anything unexpected is one
    line and exit 1, with the traceback only under `--debug`."""
    try:
        return body()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (CLI boundary)
        if "--debug" in (argv if argv is not None else sys.argv):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"error: unexpected {type(e).__name__}: {first} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


VERBOSE_HELP = (
    "messages besides the results: auto (the default, as 1), 0 (results and errors "
    "only: no progress lines, no TensorFlow / LiteRT runtime logs), 1, 2; the train "
    "commands' flag"
)


def add_verbose_argument(parser):
    """`--verbose auto/0/1/2`, spelled as on the train commands."""
    parser.add_argument("--verbose", default="auto", help=VERBOSE_HELP)


def verbosity(value):
    """The `--verbose` value as 0, 1 or 2 ("auto" is 1 outside training)."""
    if value not in ("auto", "0", "1", "2", 0, 1, 2):
        raise UsageError(f"--verbose must be auto, 0, 1 or 2, got {value!r}")
    return 1 if value == "auto" else int(value)


def import_keras_quietly():
    """Imports keras (and TensorFlow under it) with fd 2 muted: TensorFlow's C++
    runtime prints oneDNN INFO lines during the import, before absl logging is set
    up, so TF_CPP_MIN_LOG_LEVEL cannot filter them, and the CLIs promise one line
    on stderr for bad input. A failed import still raises its Python exception."""
    if "keras" in sys.modules:
        return
    with quiet_stderr():
        import keras  # noqa: F401


@contextlib.contextmanager
def quiet_stderr(enabled=True):
    """With `enabled`, fd 2 goes to /dev/null inside the block: TensorFlow's and
    LiteRT's C++ runtimes write their INFO / ERROR lines (oneDNN, cuInit,
    XNNPACK) there directly, past Python. Errors the block raises are printed
    after it, so a failure still gets its one line."""
    if not enabled:
        yield
        return
    try:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    sys.stderr.flush()
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
