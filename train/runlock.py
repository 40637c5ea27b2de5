"""One writer per run directory: train's name for zoo/run_lock.py (see there).

A second `python -m train ... --out DIR` or `python -m export ... --out DIR` refuses
with one line naming the holder's PID (exit 2); a lock left by a dead process is taken
over. export/runlock.py is the same module object, so train and export exclude each
other. It is loaded by file, without the zoo package's __init__ (Keras and TensorFlow:
seconds before a bad flag could be refused).
"""

import importlib.util
import os
import sys


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
check_writable_ancestor = _lock.check_writable_ancestor
