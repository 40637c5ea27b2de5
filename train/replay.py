"""`python -m train MODEL --config RUN/config.json [flags]`: replay a run's settings.

A run's config.json records the command's options under "train" (train.config's
`record` of the command's config object). `train.cli.config_argv` turns them back into the flags
of the same command, so the replay goes through the same parsing and checks as a typed
command; flags given after `--config` override it. Paths in the file are used as
recorded (relative to the directory the run was started from). `out`, `resume` and
`compare` are never recorded.
"""

import os

from zoo.cli import UsageError
from zoo.rundir import load_json

_KINDS = {
    "tagger": ("tagger",),
    "seq2seq": ("seq2seq", "universal_transformer"),
    "universal_transformer": ("universal_transformer", "seq2seq"),
    "sagan": ("sagan",),
}


def read_config(path, command):
    if not path:
        raise UsageError("--config needs a FILE (a run's config.json)")
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise UsageError(f"--config: file not found: {path}")
    config = load_json(path, "--config file ")
    if not isinstance(config, dict):
        raise UsageError(f"--config: {path} does not hold a JSON object")
    kind = config.get("kind")
    if kind not in _KINDS.get(command, (command,)):
        raise UsageError(f"--config: {path} is a {kind!r} run, not {command!r}")
    return config
