"""Step checkpoints of the training engine: one atomic file per checkpoint.

`checkpoints/step-00001234.npz` holds every model variable (weights, and the dropout
seed-generator states: the model's RNG), every optimizer variable (slots, iteration
count, loss scale), and a JSON record: global step, epoch, batches done in that epoch
(the data position; the epoch's batch order is a function of the seed and the epoch),
and whether the epoch is complete. It is written to a temporary name in the same
directory and renamed, so a file with the final name is always complete; a checkpoint
that fails to read is skipped in favour of the one before it.

Values are stored by variable order, not by device, so a checkpoint written under any
strategy restores under any other (2 workers -> 1 process, CPU -> GPU, ...). Only the
chief writes (`train.strategy.is_chief`); the other workers write into their scratch copy.
"""

import glob
import io
import json
import os
import re

import numpy as np

from train.errors import UsageError
from train.rundir import _atomic

PATTERN = re.compile(r"^step-(\d{8,})\.npz$")
KEEP = 3


def path_for(directory, step):
    return os.path.join(directory, f"step-{int(step):08d}.npz")


def _values(variables):
    return [np.asarray(v.numpy()) for v in variables]


def save(directory, model, optimizer, record, keep=KEEP):
    """Writes model + optimizer variables and `record` atomically; prunes old ones."""
    arrays = {f"model/{i}": a for i, a in enumerate(_values(model.variables))}
    arrays.update({f"optimizer/{i}": a for i, a in enumerate(_values(optimizer.variables))})
    arrays["record"] = np.frombuffer(json.dumps(record).encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path = path_for(directory, record["step"])
    os.makedirs(directory, exist_ok=True)
    _atomic(path, lambda f: f.write(buffer.getvalue()), "wb")
    for old in list_checkpoints(directory)[:-keep] if keep else []:
        try:
            os.unlink(old)
        except OSError:
            pass
    return path


def list_checkpoints(directory):
    """Complete checkpoint files, oldest first (temporary files never match)."""
    found = []
    for path in glob.glob(os.path.join(directory, "step-*.npz")):
        match = PATTERN.match(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]


def read_record(path):
    with np.load(path) as saved:
        return json.loads(bytes(saved["record"]).decode("utf-8"))


def latest(directory):
    """(path, record) of the newest checkpoint that reads back, or (None, None)."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, read_record(path)
        except Exception:  # noqa: BLE001  (a damaged file: fall back to the previous one)
            continue
    return None, None


def restore(path, model, optimizer):
    """Assigns the saved values to `model` and `optimizer` (built under any strategy)."""
    try:
        saved = np.load(path)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot read checkpoint {path}: {e}") from None
    with saved:
        for name, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
            count = sum(1 for k in saved.files if k.startswith(name + "/"))
            if count != len(variables):
                raise UsageError(f"checkpoint {path} holds {count} {name} variables, "
                                 f"the {name} here has {len(variables)}")
            for i, v in enumerate(variables):
                value = saved[f"{name}/{i}"]
                if tuple(value.shape) != tuple(v.shape):
                    raise UsageError(f"checkpoint {path}: {name} variable {v.path} has shape "
                                     f"{tuple(value.shape)} there, {tuple(v.shape)} here")
                v.assign(value)
        return json.loads(bytes(saved["record"]).decode("utf-8"))
