"""Atomic writes, for every command: build beside the target, then `os.replace`.

A failed or killed train or export run must leave no half-written file or version
directory and must keep what was there before. Everything is first written under a
hidden temporary name in the target's own directory (same file system, so the final
`os.replace` is atomic); the name carries the writer's PID, so temporaries of a killed
run are removed by the next run into that directory once their process is gone
(`clean_stale`). Keras-free: NumPy is imported only by `save_npz`.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import tempfile

PREFIX = ".tmp-"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(directory):
    """Removes temporaries (and a lock file) left in `directory` by runs that were killed."""
    if not os.path.isdir(directory):
        return
    from zoo import run_lock

    if run_lock.holder(directory) is None:  # a lock file left by a killed process
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, run_lock.LOCK_NAME))
    for name in os.listdir(directory):
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            _remove(os.path.join(directory, name))


def temp_path(target, directory=False):
    """A fresh hidden temporary path beside `target` (created, empty). It ends with
    `target`'s own name, so a writer that goes by the suffix (`model.save(".keras")`)
    accepts it."""
    parent = os.path.dirname(os.path.abspath(target)) or "."
    os.makedirs(parent, exist_ok=True)
    prefix = f"{PREFIX}{os.getpid()}-"
    if directory:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd, path = tempfile.mkstemp(prefix=prefix, suffix="-" + os.path.basename(target), dir=parent)
    os.close(fd)
    return path


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(OSError):
            os.remove(path)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Interrupted(BaseException):
    """Raised in place of SIGTERM's default action while a target is being built."""


@contextlib.contextmanager
def _signals_as_exceptions():
    # Only the main thread may install handlers. A handler already installed (the
    # training commands' preemption handler finishes the step first) is left alone.
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(f"interrupted by signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def building(target, directory=False):
    """Yields a temporary path; on success moves it onto `target` atomically.

    Args:
        target: final path; an existing file is replaced.
        directory: build a directory instead of a file. Directories are never
            replaced: an existing directory target is an error (a TF Serving
            version is immutable).
    On any exception (and on SIGTERM while no other handler is installed) the
    temporary is removed and the target is left as it was.
    """
    tmp = temp_path(target, directory=directory)
    try:
        with _signals_as_exceptions():
            yield tmp
            if directory:
                # os.rename onto an existing directory would fail or merge.
                if os.path.exists(target):
                    raise FileExistsError(f"{target} appeared while writing it")
                # mkdtemp makes 0700; a server running as another user must read it.
                os.chmod(tmp, 0o777 & ~_umask())
                os.rename(tmp, target)
            else:
                os.chmod(tmp, 0o666 & ~_umask())
                os.replace(tmp, target)
    finally:
        _remove(tmp)


def write_bytes(path, data):
    """`data` becomes `path` (flushed to disk first)."""
    with building(path) as tmp, os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_text(path, text):
    write_bytes(path, text.encode("utf-8"))


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_lines(path, items):
    write_text(path, "".join(f"{item}\n" for item in items))


def save_npz(path, **arrays):
    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    write_bytes(path, buffer.getvalue())


def save_model(model, path):
    """`model.save` to a temporary `.keras` file beside `path`, then rename."""
    with building(path) as tmp:
        model.save(tmp)
