"""`python -m train MODEL --config RUN/config.json [flags]`: replay a run's settings.

A run's config.json records the command's options (`"train"`: the flags of
seq2seq and sagan runs, the data and optimisation flags of tagger runs) and the
model's hyper-parameters (`"model"`). `config_argv` turns them back into flags of
the same command, matched by argparse destination, so the replay goes through
the same parsing and checks as a typed command; flags given after `--config`
override it. Paths in the file are used as recorded (relative to the directory
the run was started from). `out` and `resume` are never taken from a file.
"""

import argparse
import json
import os

from zoo.cli import UsageError

_KINDS = {
    "tagger": ("tagger",),
    "seq2seq": ("seq2seq", "universal_transformer"),
    "universal_transformer": ("universal_transformer", "seq2seq"),
    "sagan": ("sagan",),
}
_NEVER = {"out", "resume", "debug", "config", "help"}
# Options recorded under an earlier name: seq2seq's `xla` is now `--jit-compile`.
_RENAMED = {"xla": "jit_compile"}


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


def _flag(action, value):
    """argv items setting `action.dest` to `value`, or None when it cannot."""
    option = next(
        (o for o in action.option_strings if o.startswith("--")), action.option_strings[0]
    )
    if action.nargs == 0:  # store_true / store_false / store_const
        return [option] if value == action.const else None
    if (
        action.nargs is None
        and not isinstance(action, argparse._AppendAction)
        and not isinstance(value, (dict, list))
    ):
        return [option, str(value)]
    return None


def config_argv(parser, config):
    """The flags of `parser` that reproduce `config` (see the module doc)."""
    by_dest = {}
    # Canonical flags first: hidden aliases (help suppressed) only as a fallback.
    actions = sorted(parser._actions, key=lambda a: a.help == argparse.SUPPRESS)
    for action in actions:
        if action.option_strings and action.dest not in _NEVER:
            by_dest.setdefault(action.dest, []).append(action)
    values = {}
    leftovers = {}
    # "train" holds the command's own flags; "model" fills in what it lacks.
    for section in ("train", "model"):
        for key, value in (config.get(section) or {}).items():
            if key in by_dest:
                values.setdefault(key, value)
            elif _RENAMED.get(key) in by_dest and value:
                values[_RENAMED[key]] = values.get(_RENAMED[key]) or value
            elif section == "model":
                leftovers[key] = value
    argv = []
    for dest, value in values.items():
        if value is None:
            continue
        for action in by_dest[dest]:
            items = _flag(action, value)
            if items:
                argv += items
                break
    if "model_option" in by_dest:  # the tagger: hyper-parameters as --model-option KEY=JSON
        from zoo.tagger.config import DEFAULTS

        argv += [
            f"--model-option={key}={json.dumps(value)}"
            for key, value in leftovers.items()
            if key in DEFAULTS and value is not None
        ]
    return argv
