"""Atomic writes: build beside the target, then `os.replace`.

A failed or killed export must leave no half-written version directory or
`.tflite` and must keep what was there before. Everything is first written
under a hidden temporary name in the target's own directory (same file system,
so the final `os.replace` is atomic); temporaries of a killed run are removed
by the next run once their process is gone.
"""

import contextlib
import json
import os
import shutil
import signal
import tempfile

_PREFIX = ".export-tmp-"


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
    from export import runlock

    if runlock.holder(directory) is None:  # a lock file left by a killed process
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, runlock.LOCK_NAME))
    for name in os.listdir(directory):
        if not name.startswith(_PREFIX):
            continue
        try:
            pid = int(name[len(_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)


def check_target(path, flag="--out"):
    """Before any export work: `path`'s nearest existing ancestor must be a directory
    this process can write into (an --out under a file, or in a read-only directory,
    is bad input; zoo/run_lock.py's check_writable_ancestor). Raises
    zoo.cli.UsageError."""
    from export import runlock

    runlock.check_writable_ancestor(path, flag)


def temp_path(target, directory=False):
    """A fresh hidden temporary path beside `target` (created if a directory)."""
    parent = os.path.dirname(os.path.abspath(target)) or "."
    os.makedirs(parent, exist_ok=True)
    prefix = f"{_PREFIX}{os.getpid()}-"
    if directory:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd, path = tempfile.mkstemp(prefix=prefix, dir=parent)
    os.close(fd)
    return path


def _remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(OSError):
            os.remove(path)


@contextlib.contextmanager
def building(target, directory=False, overwrite=True):
    """Yields a temporary path; on success moves it onto `target` atomically.

    Args:
        target: final path.
        directory: build a directory instead of a file.
        overwrite: replace an existing file target. Directories are never
            replaced: an existing directory target is an error (a TF Serving
            version is immutable).
    On any exception (including SIGTERM/SIGINT, turned into exceptions while
    building) the temporary is removed and the target is left as it was.
    """
    tmp = temp_path(target, directory=directory)
    try:
        with _signals_as_exceptions():
            yield tmp
            if directory:
                # os.rename onto an existing directory would fail or merge.
                if os.path.exists(target):
                    raise FileExistsError(f"{target} appeared while exporting")
                # mkdtemp makes 0700; a server running as another user must read it.
                os.chmod(tmp, 0o777 & ~_umask())
                os.rename(tmp, target)
            else:
                if not overwrite and os.path.exists(target):
                    raise FileExistsError(f"{target} already exists")
                os.chmod(tmp, 0o666 & ~_umask())
                os.replace(tmp, target)
    finally:
        _remove(tmp)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Interrupted(BaseException):
    """Raised in place of the default SIGTERM action while an export is being built."""


@contextlib.contextmanager
def _signals_as_exceptions():
    # Only the main thread may install handlers; elsewhere rely on temp names.
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(f"interrupted by signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def write_bytes(path, data):
    with building(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_json(path, obj):
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())
