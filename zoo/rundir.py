"""Reading a run directory's identity: every command asks here what kind of run a
directory holds (Keras-free, so a refusal comes before the slow imports).

A training run writes the marker file first and config.json (with its `kind`) once
its settings are known (train.rundir creates run directories).
"""

import json
import os

from zoo.cli import UsageError

MARKER = ".zoo-run"


def is_run_dir(path):
    return os.path.isfile(os.path.join(path, MARKER)) or os.path.isfile(
        os.path.join(path, "config.json")
    )


def load_json(path, what=""):
    """The JSON value in `path`.

    Raises:
        UsageError: the file is unreadable, not UTF-8 or not JSON; the message
            is "unreadable {what}{path}: why".
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        raise UsageError(f"unreadable {what}{path}: {e}") from None


def read_config(run_dir):
    """The run's config.json as a dict, or None when it has none.

    Raises:
        UsageError: config.json is unreadable or not JSON, or holds no object (so
            no "kind").
    """
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return None
    config = load_json(path)
    if not isinstance(config, dict):
        raise UsageError(f'{path} has no "kind"')
    return config


def run_kind(run_dir, strict=True):
    """The kind of the run in `run_dir`: config.json's `kind`, else the marker's (a
    run still in its first epoch), else None.

    Args:
        strict: an unreadable config.json raises UsageError; with False (the train
            commands, which then refuse the directory for what it holds) it is
            passed over.
    """
    try:
        kind = (read_config(run_dir) or {}).get("kind")
    except UsageError:
        if strict:
            raise
        kind = None
    if kind:
        return str(kind)
    try:
        with open(os.path.join(run_dir, MARKER), encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def saved_model_version_dir(path):
    """The SavedModel folder `path` names: `path` itself when it holds saved_model.pb,
    else its highest numbered version (TF Serving's BASE/NAME/<version> layout), else
    None."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    if not os.path.isdir(path):
        return None
    versions = [
        int(d)
        for d in os.listdir(path)
        if d.isdigit() and os.path.isfile(os.path.join(path, d, "saved_model.pb"))
    ]
    return os.path.join(path, str(max(versions))) if versions else None
