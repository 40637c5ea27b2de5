"""One writer per output directory: export's name for zoo/run_lock.py (see there).

An export into a directory that a training run or another export is writing refuses
with one line naming the holder's PID (exit 2); a lock left by a dead process is taken
over. train/runlock.py is the same module object (export does not import train). It is
loaded by file, without the zoo package's __init__ (Keras and TensorFlow: seconds
before a bad flag could be refused).
"""

import importlib.util
import os
import sys

from export.errors import UsageError


def _shared(name="zoo.run_lock"):
    if name not in sys.modules:
        package = importlib.util.find_spec("zoo")  # found, not imported
        path = os.path.join(list(package.submodule_search_locations)[0], "run_lock.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


_lock = _shared()
LOCK_NAME, LockedError = _lock.LOCK_NAME, _lock.LockedError
holder, acquire, release, release_all = _lock.holder, _lock.acquire, _lock.release, _lock.release_all


def locked(directory):
    """Holds `directory`'s lock for the block (released after, unless held before);
    refusals are export.errors.UsageError (exit 2, one line)."""
    return _lock.locked(directory, UsageError)


def check_writable_ancestor(path, flag="--out"):
    _lock.check_writable_ancestor(path, flag, UsageError)
