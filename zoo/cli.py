"""What every command line shares (python -m train / export / zoo.*): the error
types and exit codes, the error boundary, input checks, the runtimes' log filter.

A `UsageError` is the user's fault (bad flag, missing or malformed file): one line
on stderr naming the problem and the value, exit 2. Anything else is a bug or an
environment problem: exit 1 with a short message, the traceback only with --debug.
"""

import argparse
import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings

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
    line and exit 1, with the traceback only under `--debug`. The runtimes'
    start-up lines are filtered meanwhile (`runtime_logs`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with runtime_logs(verbose_flag(argv)):
        try:
            return body()
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except Exception as e:  # noqa: BLE001  (CLI boundary)
            if "--debug" in argv:
                raise
            return unexpected(e)


def unexpected(e, hint=True):
    """Reports an unexpected failure as every command does: one line on stderr, its type
    and the message's first line (with `hint`, how to see the traceback); exit 1."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    hint = " (run with --debug for the traceback)" if hint else ""
    print(f"error: unexpected {type(e).__name__}: {first}{hint}", file=sys.stderr)
    return EXIT_FAILURE


def command_parser(module, doc):
    """The parser of `python -m MODULE`, a user command whose description is
    `doc`'s first line, with `--verbose auto/0/1/2` (spelled as on the train
    commands) and `--debug`; sets the Keras backend and TensorFlow's log level
    defaults first (each command is an entry point)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = OneLineParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument(
        "--verbose",
        default="auto",
        help="messages besides the results: auto (the default, as 1), 0 (results and errors "
        "only: no progress lines, no TensorFlow / LiteRT runtime logs), 1, 2; the train "
        "commands' flag",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def verbosity(value):
    """The `--verbose` value as 0, 1 or 2 ("auto" is 1 outside training); a bad
    value is a UsageError, checked before any other work."""
    if value not in ("auto", "0", "1", "2", 0, 1, 2):
        raise UsageError(f"--verbose must be auto, 0, 1 or 2, got {value!r}")
    return 1 if value == "auto" else int(value)


def import_keras_quietly():
    """Imports keras (and TensorFlow under it) with fd 2 muted, unless a command
    line's `runtime_logs` filter runs (it drops the start-up lines and keeps real
    problems): TensorFlow's C++ runtime prints INFO lines during the import, before
    absl logging is set up, so TF_CPP_MIN_LOG_LEVEL cannot filter them, and the
    CLIs promise one line on stderr for bad input. A failed import still raises
    its Python exception."""
    if "keras" in sys.modules:
        return
    with quiet_stderr(not _FILTER), _tensorflow_without_jax():
        import keras  # noqa: F401


@contextlib.contextmanager
def _tensorflow_without_jax():
    """Under the TensorFlow backend, `jax` reads as not installed while Keras imports
    TensorFlow, and imports as usual afterwards: tf.lite's util imports jax (when it is
    installed, as with the `jax` extra) only for its converter from JAX functions, which
    nothing here uses; skipped, a command starts ~0.5 CPU s sooner (benchmarks/results.md)."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend != "tensorflow" or "jax" in sys.modules or "tensorflow" in sys.modules:
        yield
        return
    sys.modules["jax"] = None  # `import jax` raises ImportError, which tf.lite expects
    try:
        yield
    finally:
        if "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]


# ---------------------------------------------------------------- runtime logs
# The lines TensorFlow, absl, CUDA and LiteRT write to fd 2 at start-up on a
# machine without a GPU (C++ code, past Python and, before absl's logging is
# set up, past TF_CPP_MIN_LOG_LEVEL): dropped at the default verbosity.
NOISE = (
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine",
    r"oneDNN custom operations are on",
    r"cpu_feature_guard\.cc:\d+\]",
    r"^To enable the following instructions: .* rebuild TensorFlow",
    r"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU",
    r"^[IV]\d{4} [\d:. ]+\d+ \S+:\d+\] ",  # absl INFO / VLOG lines
)
# cuInit fails on every machine without a CUDA driver or device: noise there, a
# real problem where NVIDIA's driver is loaded.
NO_GPU = r"Could not find cuda drivers|CUDA_ERROR_NO_DEVICE|no CUDA-capable device"
CUINIT = r"failed call to cuInit"

_FILTER_CHILD = r"""
import os, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # drain to the end when the command is interrupted
gpu_absent, *noise, no_gpu, cuinit = sys.argv[1:]
noise, no_gpu, cuinit = re.compile("|".join(noise)), re.compile(no_gpu), re.compile(cuinit)
prefix = re.compile(r"^[EWF]\d{4} [\d:. ]+\d+ \S+:\d+\] ")
out, seen, gpu_absent = sys.stdout.buffer, set(), gpu_absent == "1"
for raw in sys.stdin.buffer:
    line = raw.decode("utf-8", "replace").rstrip("\n")
    gpu_absent = gpu_absent or bool(no_gpu.search(line))
    if noise.search(line) or (cuinit.search(line) and gpu_absent):
        continue
    if prefix.match(line):  # an absl warning or error: one line of ours, once
        text = prefix.sub("", line)
        if text in seen:
            continue
        seen.add(text)
        line = "warning: TensorFlow runtime: " + text
    out.write((line + "\n").encode("utf-8"))
    out.flush()
"""
_FILTER = []


def verbose_flag(argv):
    """The `--verbose` value on a command line (0, 1 or 2; 1 when absent or unreadable)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--verbose=") else None
        if arg == "--verbose" and i + 1 < len(argv):
            value = argv[i + 1]
        if value in ("0", "1", "2"):
            return int(value)
    return 1


@contextlib.contextmanager
def runtime_logs(verbose=1):
    """A command line's run: at `verbose` 0 and 1 what C++ code writes to fd 2 goes
    through a filter process that drops the runtimes' start-up lines (`NOISE`; a
    cuInit failure where no GPU exists) and writes each absl warning or error
    once, as one line of ours ("warning: TensorFlow runtime: ..."); a CUDA library
    that fails to load, a GPU that cannot start, a crash's last words pass. Python's
    own `sys.stderr` writes straight to the terminal, as before. At 2 nothing is
    filtered. A process, not a thread: it drains what a crashing runtime wrote."""
    if verbose >= 2 or _FILTER:
        yield
        return
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addFilter(_no_retracing_advice)
    try:
        with warnings.catch_warnings():
            # Attention over a one-element axis (a one-character token) is legitimate.
            warnings.filterwarnings("ignore", "You are using a softmax over axis -1", UserWarning)
            with _filtered_fd2():
                yield
    finally:
        tf_logger.removeFilter(_no_retracing_advice)


def _no_retracing_advice(record):
    # TensorFlow's advice when a function traces again for new input shapes: the
    # decoders compile one program per batch shape by design (length buckets, beams).
    return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def _filtered_fd2():
    sys.stderr.flush()
    try:
        saved = os.dup(2)
        read, write = os.pipe()
    except OSError:
        yield
        return
    no_driver = "0" if os.path.exists("/proc/driver/nvidia/version") else "1"
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FILTER_CHILD, no_driver, *NOISE, NO_GPU, CUINIT],
            stdin=read,
            stdout=saved,
            stderr=saved,
        )
    except OSError:
        os.close(read)
        os.close(write)
        os.close(saved)
        yield
        return
    os.close(read)
    stream = sys.stderr
    direct = None
    try:
        if stream.fileno() == 2:  # Python's stderr keeps the terminal (as sys.stderr writes)
            direct = io.TextIOWrapper(
                io.FileIO(os.dup(saved), "w"),
                encoding=stream.encoding,
                errors="backslashreplace",
                line_buffering=True,
                write_through=True,
            )
    except (AttributeError, OSError, ValueError):
        pass
    os.dup2(write, 2)
    os.close(write)
    if direct is not None:
        sys.stderr = direct
    _FILTER.append(direct)
    try:
        yield
    finally:
        _FILTER.pop()
        if direct is not None:
            direct.flush()
            sys.stderr = stream
            direct.close()
        os.dup2(saved, 2)  # closes the pipe's last write end here: the filter sees EOF
        os.close(saved)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a child process of ours still holds the pipe
            pass


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
    stream = sys.stderr
    if _FILTER and _FILTER[-1] is not None and stream is _FILTER[-1]:
        sys.stderr = open(os.devnull, "w")  # runtime_logs pointed it past fd 2: mute it too
    try:
        yield
    finally:
        if sys.stderr is not stream:
            sys.stderr.close()
            sys.stderr = stream
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
