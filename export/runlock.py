"""One writer per output directory: `export` takes the lock `train` takes.

The same code as train/runlock.py (the run directory is the only interface between
train/ and export/, so neither imports the other; tests/test_runlock.py checks the
copies agree), plus `locked`. An export into a directory that a training run or
another export is writing refuses with one line naming the holder's PID (exit 2); a
lock left by a dead process is taken over.
"""

import contextlib
import os

from export.errors import UsageError

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None

LOCK_NAME = ".zoo-lock"
_held = {}  # realpath of the directory -> file descriptor


class LockedError(UsageError):
    """The directory is locked by another live process."""

    def __init__(self, directory, pid):
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"{directory} is in use by {holder} (lock file {os.path.join(directory, LOCK_NAME)}); "
                         f"wait for it to finish or stop it, or use another --out")
        self.pid = pid


def _read_pid(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        return int(text.split()[0]) if text else None
    except (OSError, ValueError, IndexError):
        return None


def holder(directory):
    """The PID holding `directory`'s lock, or None (no lock, or a stale one)."""
    path = os.path.join(directory, LOCK_NAME)
    if fcntl is None or not os.path.exists(path):
        return None
    if os.path.realpath(directory) in _held:
        return os.getpid()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def acquire(directory):
    """Locks `directory` (which must exist) for this process; re-entrant.
    Raises LockedError naming the holder's PID."""
    if fcntl is None:
        return
    key = os.path.realpath(directory)
    if key in _held:
        return
    path = os.path.join(directory, LOCK_NAME)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise LockedError(directory, pid) from None
        # The holder before us may have removed the file between our open and our
        # flock: then we hold a lock on a file nobody else can see. Try again.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    _held[key] = (fd, path)


def release(directory):
    entry = _held.pop(os.path.realpath(directory), None)
    if entry is None:
        return
    fd, path = entry
    try:
        os.unlink(path)  # while still locked: a waiting process re-checks the inode
    except OSError:
        pass
    os.close(fd)


def release_all():
    for key in list(_held):
        release(key)


@contextlib.contextmanager
def locked(directory):
    """Holds `directory`'s lock for the block (released after, unless held before)."""
    held = os.path.realpath(directory) in _held
    try:
        acquire(directory)
    except OSError as e:
        raise UsageError(f"cannot write into {directory}: {e.strerror}") from None
    try:
        yield
    finally:
        if not held:
            release(directory)
