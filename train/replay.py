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
    i = 0
    while i < len(argv):
        item = argv[i]
        if item == "--config":
            if i + 1 >= len(argv):
                raise UsageError("--config needs a FILE (a run's config.json)")
            path, i = argv[i + 1], i + 2
            continue
        if item.startswith("--config="):
            path = item.split("=", 1)[1]
        else:
            rest.append(item)
        i += 1
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
