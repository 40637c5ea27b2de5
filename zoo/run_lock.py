"""One writer per output directory, and whether this process may create one there.

The lock: a second `python -m train ... --out DIR` (a double-clicked job, a retried
scheduler task) or `python -m export ... --out DIR` refuses with one line naming the
holder's PID (exit 2). The lock is an exclusive `flock` on `DIR/.zoo-lock`, so the
kernel releases it when its process dies: a lock file left by a killed process (a dead
PID) is taken over. The file is removed when the lock is released.

`check_writable_ancestor`: before any work, an output path that does not exist yet
must have, as its nearest existing ancestor, a directory this process can write into.

The one copy of this code for train/, export/ and the zoo CLIs (train and export use
the same lock, so they exclude each other). Keras-free, so a held lock is refused before
the slow imports. Refusals are zoo.cli.UsageError (one line, exit 2).
"""

import contextlib
import os

from zoo.cli import UsageError

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None

LOCK_NAME = ".zoo-lock"
_held = {}  # realpath of the directory -> file descriptor


def _in_use(directory, pid):
    holder = f"process {pid}" if pid else "another process"
    return UsageError(
        f"{directory} is in use by {holder} (lock file {os.path.join(directory, LOCK_NAME)}); "
        f"wait for it to finish or stop it, or use another --out"
    )


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
    """Locks `directory` (which must exist) for this process; re-entrant. A lock held
    by another process, or a directory that cannot take the lock file: UsageError
    (one line, naming the holder's PID)."""
    try:
        _acquire(directory)
    except OSError as e:
        raise UsageError(f"cannot write into {directory}: {e.strerror}") from None


def _acquire(directory):
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
            raise _in_use(directory, pid) from None
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


def refuse_if_held(directory):
    """Refuses (UsageError, one line naming the PID) when another live process holds
    `directory`'s lock; checked before any work, the lock itself is taken later."""
    pid = holder(directory) if os.path.isdir(directory) else None
    if pid is not None and pid != os.getpid():
        raise _in_use(directory, pid)


@contextlib.contextmanager
def locked(directory):
    """Holds `directory`'s lock for the block (released after, unless held before);
    refusals as `acquire`'s."""
    held = os.path.realpath(directory) in _held
    acquire(directory)
    try:
        yield
    finally:
        if not held:
            release(directory)


def check_writable_ancestor(path, flag, creating=False):
    """`path` does not exist yet: its nearest existing ancestor must be a directory this
    process can write into (found before any work, not when the first file is written).
    Raises UsageError naming the flag, the path and the ancestor. `creating`: the
    not-writable message says the path cannot be created (the train CLIs' wording)."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"{flag} {path}: {'cannot create it, ' if creating else ''}{parent} is not writable"
        )
