"""One writer per output directory: export's name for zoo/run_lock.py (see there).

An export into a directory that a training run or another export is writing refuses
with one line naming the holder's PID (exit 2); a lock left by a dead process is taken
over. Training uses the same module, zoo/run_lock.py, so train and export exclude
each other.
"""

from zoo import run_lock as _lock
from zoo.cli import UsageError

LOCK_NAME, LockedError = _lock.LOCK_NAME, _lock.LockedError
holder, acquire, release, release_all = (
    _lock.holder,
    _lock.acquire,
    _lock.release,
    _lock.release_all,
)


def locked(directory):
    """Holds `directory`'s lock for the block (released after, unless held before);
    refusals are zoo.cli.UsageError (exit 2, one line)."""
    return _lock.locked(directory, UsageError)


def check_writable_ancestor(path, flag="--out"):
    _lock.check_writable_ancestor(path, flag, UsageError)
