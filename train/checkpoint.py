"""Step checkpoints of the training engine: one atomic file per checkpoint.

`checkpoints/step-00001234.npz` holds every model variable (weights, and the dropout
seed-generator states: the model's RNG), every optimizer variable (slots, iteration
count, loss scale), and a JSON record: global step, epoch, batches done in that epoch
(the data position; the epoch's batch order is a function of the seed and the epoch),
and whether the epoch is complete. It is written to a temporary name in the same
directory and renamed, so a file with the final name is always complete.

Values are keyed by variable path (Keras's `variable.path`, e.g.
`encoder_0/attention/query/kernel`), not by position: a restore checks that every
variable of the model has a value of its shape under its own path and that the
checkpoint holds nothing else, and refuses with one line naming the first variable
that differs. The file also records a hash of the model's configuration (a change that
adds no variable, e.g. another activation or dropout rate, is refused too) and a
SHA-256 of all its values: a truncated or damaged file is detected and `latest` falls
back to the previous good checkpoint (the last `KEEP` are kept).

Keras numbers automatically named objects per process (`seed_generator_11`, `adam_2`),
so the same model built twice in one process has other paths. When the paths of the
file and the model are not the same set, both sides are matched on canonical paths, in
which every `NAME_<n>` / `NAME` component is renumbered by order of first appearance
among its siblings; a fresh process (every CLI --resume) matches exact paths.

Checkpoints of the first, positional format (`model/0`, `model/1`, ...) still restore,
by position with counts and shapes checked, and say so on stderr.

Values are stored per variable, not per device, so a checkpoint written under any
strategy restores under any other (2 workers -> 1 process, CPU -> GPU, ...). Only the
chief writes (`train.strategy.is_chief`); the other workers write into their scratch copy.
"""

import glob
import hashlib
import io
import json
import os
import re
import shutil
import sys
import zipfile
import zlib

import numpy as np

from zoo import atomic
from zoo.cli import UsageError

PATTERN = re.compile(r"^step-(\d{8,})\.npz$")
KEEP = 3
FORMAT = 2
MANIFEST = "__manifest__"
CHECKSUM = "__sha256__"
_DROP_FROM_CONFIG = {"name", "dtype", "dtype_policy", "trainable"}


class DamagedCheckpoint(UsageError):
    """A checkpoint file that cannot be read back whole (truncated, corrupted)."""


def path_for(directory, step):
    return os.path.join(directory, f"step-{int(step):08d}.npz")


# ------------------------------------------------------------------ keys and hashes
def _unique(paths):
    """Paths made unique: a repeated path gets `#<n>` (n-th repeat)."""
    seen, out = {}, []
    for p in paths:
        n = seen.get(p, 0)
        seen[p] = n + 1
        out.append(p if n == 0 else f"{p}#{n}")
    return out


def variable_paths(variables):
    return _unique([str(getattr(v, "path", None) or v.name) for v in variables])


def canonical(paths):
    """Each path with automatically numbered components renumbered by order of first
    appearance among siblings of the same base name ("dense_7" -> "dense#0")."""
    numbering = {}
    out = []
    for path in paths:
        parent, parts = "", []
        for component in path.split("/"):
            base = re.sub(r"_\d+$", "", component)
            names = numbering.setdefault((parent, base), {})
            index = names.setdefault(component, len(names))
            parts.append(f"{base}#{index}")
            parent = "/".join(parts)
        out.append("/".join(parts))
    return out


def _normalised(obj, numbering):
    """The config without names and dtypes, every string renumbered as `canonical`
    does (references to automatically named layers: `keras_history: ["dense_3", ...]`)."""
    if isinstance(obj, dict):
        return {
            str(k): _normalised(obj[k], numbering)
            for k in sorted(obj, key=str)
            if k not in _DROP_FROM_CONFIG
        }
    if isinstance(obj, (list, tuple)):
        return [_normalised(v, numbering) for v in obj]
    if isinstance(obj, str):
        base = re.sub(r"_\d+$", "", obj)
        names = numbering.setdefault(base, {})
        return f"{base}#{names.setdefault(obj, len(names))}"
    return obj


def config_hash(*models):
    """A short hash of the models' configurations (names and dtypes left out: they
    change with the process and the precision policy, not with the architecture)."""
    configs = []
    for model in models:
        try:
            config = model.get_config()
        except Exception:  # noqa: BLE001  (a model without a config: its class name)
            config = None
        configs.append([type(model).__name__, _normalised(config, {})])
    text = json.dumps(configs, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _digest(arrays):
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode("utf-8"))
        h.update(a.tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------ packing
def _keys(variables, refs=None):
    """(exact keys, canonical keys) of `variables`. With `refs` (the trainable
    variables an optimizer updates), an optimizer variable named after its model
    variable (`adam_3/dense_1_kernel_momentum`) is keyed by that variable's key and
    its slot (`dense_1/kernel:momentum`), and the optimizer's own name (numbered per
    process) is left out of every key."""
    paths = variable_paths(variables)
    if refs is None:
        return paths, canonical(paths)
    ref_exact = variable_paths(refs)
    ref_canon = canonical(ref_exact)
    prefixes = sorted(
        ((p.replace("/", "_") + "_", i) for i, p in enumerate(ref_exact)),
        key=lambda item: -len(item[0]),
    )
    exact, canon = [], []
    for path in paths:
        rest = path.split("/", 1)[1] if "/" in path else path
        for prefix, i in prefixes:
            if rest.startswith(prefix):
                slot = rest[len(prefix) :]
                exact.append(f"{ref_exact[i]}:{slot}")
                canon.append(f"{ref_canon[i]}:{slot}")
                break
        else:
            exact.append(rest)
            canon.append(canonical([rest])[0])
    return _unique(exact), _unique(canon)


def pack(groups, refs=None, config=None, extra=None):
    """npz members for `groups` ({group: variables}), a manifest (format, every
    group's exact and canonical keys, config hash) and a SHA-256 over every member
    (`extra` included). `refs`: {optimizer group: the variables it updates}."""
    arrays, keys = {}, {}
    for group, variables in groups.items():
        variables = list(variables)
        exact, canon = _keys(variables, (refs or {}).get(group))
        keys[group] = {"exact": exact, "canonical": canon}
        for key, v in zip(exact, variables):
            arrays[f"{group}/{key}"] = np.asarray(v.numpy())
    manifest = {"format": FORMAT, "groups": keys, "config_hash": config}
    arrays[MANIFEST] = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)
    arrays.update(extra or {})
    arrays[CHECKSUM] = np.frombuffer(_digest(arrays).encode("ascii"), dtype=np.uint8)
    return arrays


def _keep_as(path, previous):
    """`previous` becomes what `path` holds now (a hard link, else a copy, renamed into
    place: `previous` is never partial)."""
    tmp = previous + ".link-tmp"
    try:
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, previous)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_npz(path, arrays, previous=None):
    """Writes `arrays` atomically to `path`. With `previous`, the file `path` held so
    far is kept as `previous` (a hard link, else a copy, made before the new file is
    renamed into place: there is no moment without a complete `path`)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    if previous and os.path.exists(path):
        _keep_as(path, previous)
    atomic.write_bytes(path, buffer.getvalue())


def load_verified(path):
    """Every member of the .npz at `path`, checked against its SHA-256 (files of the
    positional format have none: the zip CRCs still catch damaged members).
    Raises DamagedCheckpoint."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, zlib.error) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DamagedCheckpoint(f"checkpoint {path} cannot be read ({reason})") from None
    stored = arrays.pop(CHECKSUM, None)
    if stored is not None and bytes(stored).decode("ascii", "replace") != _digest(arrays):
        raise DamagedCheckpoint(f"checkpoint {path} fails its SHA-256 checksum (damaged)")
    if stored is None and MANIFEST in arrays:
        raise DamagedCheckpoint(f"checkpoint {path} has no checksum")
    return arrays


def manifest(arrays):
    if MANIFEST not in arrays:
        return None
    return json.loads(bytes(arrays[MANIFEST]).decode("utf-8"))


def _mismatch(path, group, message):
    return UsageError(f"checkpoint {path} does not fit this model: {group} variable {message}")


def _match(path, group, saved, variables, refs):
    """[(variable, member key)], or a UsageError naming the first differing variable:
    exact keys when both sides have the same set, else canonical keys."""
    exact, canon = _keys(variables, refs)
    if set(exact) == set(saved["exact"]):
        return list(zip(variables, exact))
    saved_canon = saved["canonical"]
    if set(canon) == set(saved_canon):
        by_key = dict(zip(saved_canon, saved["exact"]))
        return [(v, by_key[k]) for v, k in zip(variables, canon)]
    missing = next((e for e, k in zip(exact, canon) if k not in set(saved_canon)), None)
    if missing is not None:
        return _mismatch(path, group, f"{missing!r} is not in the checkpoint")
    extra = next(e for e, k in zip(saved["exact"], saved_canon) if k not in set(canon))
    return _mismatch(path, group, f"{extra!r} is in the checkpoint but not in this model")


def unpack(path, arrays, groups, refs=None, config=None, optional=()):
    """Checks every group's keys and shapes (and the config hash) before assigning
    anything; then assigns. `optional`: groups that may be absent on either side.
    Raises UsageError naming the first differing variable."""
    info = manifest(arrays)
    if info is None:
        return _unpack_positional(path, arrays, groups, optional)
    plan = []
    for group, variables in groups.items():
        variables = list(variables)
        saved = info["groups"].get(group)
        if saved is None:
            if group in optional:
                continue
            raise UsageError(
                f"checkpoint {path} does not fit this model: it has no {group} variables"
            )
        pairs = _match(path, group, saved, variables, (refs or {}).get(group))
        if isinstance(pairs, UsageError):
            raise pairs
        for v, key in pairs:
            value = arrays[f"{group}/{key}"]
            if tuple(value.shape) != tuple(v.shape):
                raise _mismatch(
                    path,
                    group,
                    f"{key!r} has shape {tuple(value.shape)} there, {tuple(v.shape)} here",
                )
            plan.append((v, value))
    missing = sorted(set(info["groups"]) - set(groups) - set(optional))
    if missing:
        raise UsageError(
            f"checkpoint {path} does not fit this model: it holds {missing[0]} "
            f"variables this model lacks"
        )
    saved_hash = info.get("config_hash")
    if config is not None and saved_hash is not None and saved_hash != config:
        raise UsageError(
            f"checkpoint {path} was written for another model configuration "
            f"(config hash {saved_hash} there, {config} here)"
        )
    for v, value in plan:
        v.assign(value)


def _unpack_positional(path, arrays, groups, optional):
    plan = []
    for group, variables in groups.items():
        variables = list(variables)
        count = sum(1 for k in arrays if k.startswith(group + "/"))
        if count == 0 and group in optional:
            continue
        if count != len(variables):
            raise UsageError(
                f"checkpoint {path} holds {count} {group} variables, "
                f"the {group} here has {len(variables)}"
            )
        for i, v in enumerate(variables):
            value = arrays[f"{group}/{i}"]
            if tuple(value.shape) != tuple(v.shape):
                raise UsageError(
                    f"checkpoint {path}: {group} variable {v.path} has shape "
                    f"{tuple(value.shape)} there, {tuple(v.shape)} here"
                )
            plan.append((v, value))
    for v, value in plan:
        v.assign(value)
    print(
        f"note: {os.path.basename(path)} is a positional checkpoint (an older format): "
        f"restored by position, counts and shapes checked",
        file=sys.stderr,
    )


# ------------------------------------------------------------------ engine checkpoints
def save(directory, model, optimizer, record, keep=KEEP):
    """Writes model + optimizer variables and `record` atomically; prunes old ones."""
    record_bytes = np.frombuffer(json.dumps(record).encode("utf-8"), dtype=np.uint8)
    arrays = pack(
        {"model": model.variables, "optimizer": optimizer.variables},
        refs={"optimizer": model.trainable_variables},
        config=config_hash(model),
        extra={"record": record_bytes},
    )
    path = path_for(directory, record["step"])
    os.makedirs(directory, exist_ok=True)
    write_npz(path, arrays)
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


def _record(arrays):
    return json.loads(bytes(arrays["record"]).decode("utf-8"))


def read_record(path):
    return _record(load_verified(path))


def latest_good(directory, accept=None):
    """(path, record, damaged) of the newest checkpoint that reads back whole and
    passes its checksum (and whose record `accept` takes, if given); `damaged` lists
    the (path, reason) of newer ones skipped as damaged."""
    damaged = []
    for path in reversed(list_checkpoints(directory)):
        try:
            record = read_record(path)
        except (UsageError, ValueError, KeyError) as e:  # damaged: try the previous one
            damaged.append((path, str(e)))
            continue
        if accept is None or accept(record):
            return path, record, damaged
    return None, None, damaged


def latest(directory):
    """(path, record) of the newest good checkpoint, or (None, None)."""
    path, record, _ = latest_good(directory)
    return path, record


def restore(path, model, optimizer):
    """Assigns the saved values to `model` and `optimizer` (built under any strategy)
    after checking every key and shape; returns the record."""
    arrays = load_verified(path)
    unpack(
        path,
        arrays,
        {"model": model.variables, "optimizer": optimizer.variables},
        refs={"optimizer": model.trainable_variables},
        config=config_hash(model),
    )
    return _record(arrays)


# ------------------------------------------------------------------ checked files
# Files that --resume reads but that are not .npz checkpoints (the tagger's and
# seq2seq's last.keras and best.weights.h5, the SAGAN's classifier.keras): each is
# written with a record `NAME.sha256` (JSON: the file's SHA-256, its size, and what
# the caller wants to know about that copy, e.g. the training state it belongs to),
# and the copy it replaces is kept as `STEM.prev.EXT` with its record. Order of the
# writes: the previous pair is linked aside, the new file is written to a temporary
# name, its record is written, the file is renamed into place. A crash at any point
# leaves at least one pair that matches; a file that does not match its record
# (truncated, corrupted, or its record is) is replaced by the previous good copy,
# saying so, and when there is none --resume refuses with one line (exit 2).
RECORD = ".sha256"


def previous_name(path):
    """`last.keras` -> `last.prev.keras`, `best.weights.h5` -> `best.prev.weights.h5`."""
    head, name = os.path.split(path)
    stem, dot, ext = name.partition(".")
    return os.path.join(head, f"{stem}.prev.{ext}" if dot else f"{name}.prev")


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checked(path, write, meta=None, keep_previous=True):
    """`write(tmp_path)` writes the file; it becomes `path` with its record (`meta`
    included). With `keep_previous`, the pair `path` held so far is kept as
    `previous_name(path)` first. A failed write leaves `path` and its record as they
    were, and no temporary file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    try:
        write(tmp)
        record = {"sha256": file_sha256(tmp), "bytes": os.path.getsize(tmp), "meta": meta}
        if keep_previous and os.path.exists(path) and os.path.exists(path + RECORD):
            previous = previous_name(path)
            _keep_as(path, previous)
            _keep_as(path + RECORD, previous + RECORD)
        atomic.write_text(path + RECORD, json.dumps(record) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_record(path):
    with open(path + RECORD, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise ValueError("not a checksum record")
    return record


def check_file(path):
    """(record, None) when `path` matches its record, else (None, why: one line)."""
    if not os.path.exists(path):
        return None, f"{path} is missing"
    try:
        record = _read_record(path)
    except (OSError, ValueError, UnicodeDecodeError):
        return (
            None,
            f"{path}: its checksum record {os.path.basename(path) + RECORD} cannot be read (damaged)",
        )
    size = os.path.getsize(path)
    if record.get("bytes") is not None and size != record["bytes"]:
        return None, f"{path} is truncated or damaged ({size} bytes, {record['bytes']} written)"
    if file_sha256(path) != record["sha256"]:
        return None, f"{path} fails its SHA-256 checksum (damaged)"
    return record, None


def checked(path):
    """What --resume may read at `path`: (meta, why). `path` matches its record:
    (its meta, None). It does not and the previous copy does: (the previous copy's
    meta, why `path` is not used); `fall_back(path, why)` then puts that copy in place.
    Neither: DamagedCheckpoint (one line, exit 2). Files of runs written before the
    records (no record on either copy) and absent files: (None, None), as they are."""
    previous = previous_name(path)
    if not any(os.path.exists(p + RECORD) for p in (path, previous)):
        return None, None
    record, why = check_file(path)
    if record is not None:
        return record.get("meta"), None
    good = check_file(previous)[0] if os.path.exists(previous) else None
    if good is None:
        raise DamagedCheckpoint(f"{why}; no earlier good copy to fall back to")
    return good.get("meta"), why


def fall_back(path, why):
    """The previous pair copied back into place (the damaged file kept as
    NAME.damaged; the record first: a crash in between leaves `path` not matching,
    and the previous pair still there), and one line on stderr saying so."""
    previous = previous_name(path)
    if os.path.exists(path):
        os.replace(path, path + ".damaged")
    # Copies, not links: the two stay independent copies until the next save.
    for source, target in ((previous + RECORD, path + RECORD), (previous, path)):
        with open(source, "rb") as f:
            data = f.read()
        atomic.write_bytes(target, data)
    print(f"{why}; falling back to {os.path.basename(previous)}", file=sys.stderr)


def recover(path):
    """`checked(path)`, then the fallback if needed: (meta, fell_back)."""
    meta, why = checked(path)
    if why is not None:
        fall_back(path, why)
    return meta, why is not None
