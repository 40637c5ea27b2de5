"""Run directories: creation rules and atomic writes.

A run directory holds what one training run wrote (README, "Models and command lines"). The CLIs
refuse to write into a directory that holds something else, and never overwrite a
finished run unless asked to continue it (--resume).
"""

import io
import json
import os
import tempfile

import numpy as np

from zoo import run_lock as runlock
from zoo.cli import UsageError

MARKER = ".zoo-run"


def is_run_dir(path):
    return os.path.isfile(os.path.join(path, MARKER)) or os.path.isfile(
        os.path.join(path, "config.json")
    )


def run_kind(path):
    """The kind of the run in `path` (config.json, else the marker), or None."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            kind = json.load(f).get("kind")
        if kind:
            return str(kind)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def check_out_dir(path, resume=False, kinds=None):
    """Validates --out before anything is written. Returns True if it exists already.

    `kinds`: the run kinds this command can --resume; a run of another kind is refused
    here, before TensorFlow is imported.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out exists and is not a directory: {path}")
    if not os.path.exists(path):
        if resume:
            raise UsageError(f"--resume: run directory not found: {path}")
        check_creatable(path)
        return False
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out is not writable: {path}")
    pid = runlock.holder(path)
    if pid is not None and pid != os.getpid():
        raise UsageError(str(runlock.LockedError(path, pid)))
    if not [name for name in os.listdir(path) if name != runlock.LOCK_NAME]:
        if resume:
            raise UsageError(f"--resume: nothing to resume in empty directory: {path}")
        lock(path)
        return True
    if not is_run_dir(path):
        raise UsageError(
            f"--out exists and is not a run directory (refusing to write into it): {path}"
        )
    if not resume:
        raise UsageError(
            f"--out already holds a run: {path} (use --resume to continue it, or another --out)"
        )
    found = run_kind(path)
    if kinds and found is not None and found not in kinds:
        raise UsageError(
            f"--resume: {path} is a {found!r} run, not {' or '.join(repr(k) for k in kinds)}"
        )
    lock(path)
    return True


def lock(path):
    """Locks the run directory `path` for this process (zoo.run_lock); another live
    process holding it is a UsageError naming its PID. Released when the CLI ends."""
    try:
        runlock.acquire(path)
    except runlock.LockedError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write into {path}: {e.strerror}") from None


def check_creatable(path, flag="--out"):
    """`path` does not exist yet: its nearest existing ancestor must be a directory this
    process can write into (zoo/run_lock.py's check_writable_ancestor)."""
    runlock.check_writable_ancestor(path, flag, UsageError, creating=True)


def create_run_dir(path, kind):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the run directory {path}: {e.strerror}") from None
    lock(path)
    marker = os.path.join(path, MARKER)
    if not os.path.exists(marker):
        atomic_write_text(marker, kind + "\n")


def _atomic(path, write, mode):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text):
    _atomic(path, lambda f: f.write(text), "w")


def atomic_write_json(path, obj):
    _atomic(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=False) + "\n"), "w")


def atomic_write_lines(path, items):
    atomic_write_text(path, "".join(f"{item}\n" for item in items))


def atomic_save_npz(path, **arrays):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    _atomic(path, lambda f: f.write(buffer.getvalue()), "wb")


def atomic_save_model(model, path):
    """`model.save` to a temporary `.keras` file in the same directory, then rename."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    try:
        model.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
