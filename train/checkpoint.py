"""The one checkpoint format of `python -m train` (docs/architecture.md, "One checkpoint
format"): groups of variables (`model`, `optimizer`; SAGAN's `g`, `d`, `ema`, ...), a
manifest and a JSON record (the training position and the run's state, from train.engine).

Keras numbers automatically named objects per process (`seed_generator_11`, `adam_2`),
so the same model built twice in one process has other paths. When the keys of the
file and the model are not the same set, both sides are matched on canonical keys, in
which every `NAME_<n>` / `NAME` component is renumbered by order of first appearance
among its siblings; a fresh process (every CLI --resume) matches exact keys.
"""

import contextlib
import glob
import hashlib
import io
import json
import os
import re
import zipfile
import zlib

import numpy as np

from zoo import atomic
from zoo.cli import UsageError

KEEP = 3
FORMAT = 3
MANIFEST = "__manifest__"
RECORD = "__record__"
CHECKSUM = "__sha256__"
_DROP_FROM_CONFIG = {"name", "dtype", "dtype_policy", "trainable"}


class DamagedCheckpoint(UsageError):
    """A checkpoint file that cannot be read back whole (truncated, corrupted)."""


def path_for(directory, step, name="step"):
    return os.path.join(directory, f"{name}-{int(step):08d}.npz")


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


def _renumbered(name, numbering, scope=""):
    """`name` with an automatic number renumbered by order of first appearance among the
    names of the same base in `scope` ("dense_7" -> "dense#0")."""
    base = re.sub(r"_\d+$", "", name)
    names = numbering.setdefault((scope, base), {})
    return f"{base}#{names.setdefault(name, len(names))}"


def canonical(paths):
    """The paths with every component renumbered (`_renumbered`) among its siblings."""
    numbering = {}
    out = []
    for path in paths:
        parts = []
        for component in path.split("/"):
            parts.append(_renumbered(component, numbering, "/".join(parts)))
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
        return _renumbered(obj, numbering)
    return obj


def config_hash(models):
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


def _json_member(value):
    return np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)


# ------------------------------------------------------------------ writing
def save(directory, groups, record, *, name="step", keep=KEEP, refs=None, models=()):
    """Writes `groups` ({group: variables}) and `record` (JSON; its "step" numbers the
    file) atomically as `NAME-<step>.npz`; keeps the newest `keep` files of NAME.
    `refs`: {optimizer group: the variables it updates}; `models`: whose configs the
    file's config hash covers. Returns the path."""
    arrays, keys = {}, {}
    for group, variables in groups.items():
        variables = list(variables)
        exact, canon = _keys(variables, (refs or {}).get(group))
        keys[group] = {"exact": exact, "canonical": canon}
        for key, v in zip(exact, variables):
            arrays[f"{group}/{key}"] = np.asarray(v.numpy())
    arrays[MANIFEST] = _json_member(
        {"format": FORMAT, "groups": keys, "config_hash": config_hash(models)}
    )
    arrays[RECORD] = _json_member(record)
    arrays[CHECKSUM] = np.frombuffer(_digest(arrays).encode("ascii"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    os.makedirs(directory, exist_ok=True)
    path = path_for(directory, record["step"], name)
    atomic.write_bytes(path, buffer.getvalue())
    for old in list_checkpoints(directory, name)[:-keep]:
        with contextlib.suppress(OSError):
            os.unlink(old)
    return path


# ------------------------------------------------------------------ reading
def list_checkpoints(directory, name="step"):
    """Complete checkpoint files of NAME, oldest first (temporary files never match)."""
    pattern = re.compile(rf"^{re.escape(name)}-(\d{{8,}})\.npz$")
    found = []
    for path in glob.glob(os.path.join(glob.escape(str(directory)), f"{name}-*.npz")):
        match = pattern.match(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]


def load(path):
    """Every member of the checkpoint at `path`, checked against its SHA-256.
    Raises DamagedCheckpoint; a file of another format is refused in one line."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, zlib.error) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DamagedCheckpoint(f"checkpoint {path} cannot be read ({reason})") from None
    stored = arrays.pop(CHECKSUM, None)
    other_format = DamagedCheckpoint(
        f"checkpoint {path} is not of this version's format (written by an earlier "
        f"version of the project?); start the run again"
    )
    if stored is None or MANIFEST not in arrays or RECORD not in arrays:
        raise other_format
    if bytes(stored).decode("ascii", "replace") != _digest(arrays):
        raise DamagedCheckpoint(f"checkpoint {path} fails its SHA-256 checksum (damaged)")
    # The same members with another layout inside (keys, groups) is another format too.
    if _member(arrays, MANIFEST).get("format") != FORMAT:
        raise other_format
    return arrays


def _member(arrays, key):
    return json.loads(bytes(arrays[key]).decode("utf-8"))


def read_record(path):
    return _member(load(path), RECORD)


def latest(directory, name="step", accept=None):
    """(path, record, damaged) of the newest checkpoint of NAME that reads back whole
    and passes its checksum (and whose record `accept` takes, if given); `damaged`
    lists the (path, reason) of newer ones skipped as damaged."""
    damaged = []
    for path in reversed(list_checkpoints(directory, name)):
        try:
            record = read_record(path)
        except (UsageError, ValueError, KeyError) as e:  # damaged: try the previous one
            damaged.append((path, str(e)))
            continue
        if accept is None or accept(record):
            return path, record, damaged
    return None, None, damaged


def _mismatch(path, group, message):
    return UsageError(f"checkpoint {path} does not fit this model: {group} variable {message}")


def _match(path, group, saved, variables, refs):
    """[(variable, member key)]: exact keys when both sides have the same set, else
    canonical keys. Raises UsageError naming the first differing variable."""
    exact, canon = _keys(variables, refs)
    if set(exact) == set(saved["exact"]):
        return list(zip(variables, exact))
    saved_canon = saved["canonical"]
    if set(canon) == set(saved_canon):
        by_key = dict(zip(saved_canon, saved["exact"]))
        return [(v, by_key[k]) for v, k in zip(variables, canon)]
    missing = next((e for e, k in zip(exact, canon) if k not in set(saved_canon)), None)
    if missing is not None:
        raise _mismatch(path, group, f"{missing!r} is not in the checkpoint")
    extra = next(e for e, k in zip(saved["exact"], saved_canon) if k not in set(canon))
    raise _mismatch(path, group, f"{extra!r} is in the checkpoint but not in this model")


def restore(path, groups, *, refs=None, models=(), optional=()):
    """Checks every group's keys and shapes (and the config hash) before assigning
    anything, then assigns; returns the record. `optional`: groups that may be absent
    on either side. Raises UsageError naming the first differing variable."""
    arrays = load(path)
    info = _member(arrays, MANIFEST)
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
        for v, key in _match(path, group, saved, variables, (refs or {}).get(group)):
            value = arrays[f"{group}/{key}"]
            if tuple(value.shape) != tuple(v.shape):
                raise _mismatch(
                    path,
                    group,
                    f"{key!r} has shape {tuple(value.shape)} there, {tuple(v.shape)} here",
                )
            plan.append((v, value))
    extra = sorted(set(info["groups"]) - set(groups) - set(optional))
    if extra:
        raise UsageError(
            f"checkpoint {path} does not fit this model: it holds {extra[0]} "
            f"variables this model lacks"
        )
    if models and info["config_hash"] != config_hash(models):
        raise UsageError(
            f"checkpoint {path} was written for another model configuration "
            f"(config hash {info['config_hash']} there, {config_hash(models)} here)"
        )
    for v, value in plan:
        v.assign(value)
    return _member(arrays, RECORD)
