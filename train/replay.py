"""`python -m train MODEL --config RUN/config.json [flags]`: replay a run's settings.

A run's config.json records the command's options under "train" (train.config's
`record` of the command's config object). `train.cli.config_argv` turns them back into the flags
of the same command, so the replay goes through the same parsing and checks as a typed
command; flags given after `--config` override it. Paths in the file are used as
recorded (relative to the directory the run was started from). `out`, `resume` and
`compare` are never recorded.
"""

import json
import os

from zoo.cli import UsageError

_KINDS = {
    "tagger": ("tagger",),
    "seq2seq": ("seq2seq", "universal_transformer"),
    "universal_transformer": ("universal_transformer", "seq2seq"),
    "sagan": ("sagan",),
}


def split_config(argv):
    """(path or None, argv without `--config PATH` / `--config=PATH`)."""
    rest, path = [], None
    items = iter(argv)
    for item in items:
        if item == "--config":
            path = next(items, None)
            if path is None:
                raise UsageError("--config needs a FILE (a run's config.json)")
        elif item.startswith("--config="):
            path = item.split("=", 1)[1]
        else:
            rest.append(item)
    return path, rest


def read_config(path, command):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--config: file not found: {path}") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--config: unreadable {path}: {e}") from None
    if not isinstance(config, dict):
        raise UsageError(f"--config: {path} does not hold a JSON object")
    kind = config.get("kind")
    if kind not in _KINDS.get(command, (command,)):
        raise UsageError(f"--config: {path} is a {kind!r} run, not {command!r}")
    return config
