"""One config object per training command: a dataclass whose fields are the command's
options, each declared once with `option` (default, help, check). From the class come
the command's flags (`add_arguments`), the checked object (`from_args`: one line and
exit 2 naming the flag as typed), config.json's "train" section (`record`), the flags
that replay a recorded run (`replay_argv`, `--config`) and the object --resume reads
back (`from_record`, which refuses a section of other fields), all with the same
defaults.
"""

import argparse
import dataclasses
import os

from zoo.cli import DataError, UsageError


def option(
    default=None,
    help=None,
    *,
    check=None,
    kind=None,
    record=True,
    resume=False,
    group=None,
    name=None,
    **argparse_kwargs,
):
    """A config field. help=None: recorded, but no flag (a value the run derives). `kind`:
    the flag's type when the default is None and it is not a str;
    `check(value)`: True, or what is wrong ("must be >= 0"); `record`: written to
    config.json; `resume`: a value given (not None) on --resume replaces the recorded
    one, where any other recorded option typed with another value is refused;
    `group`: the --help section; `name`: the flag, when not the field's.
    Other keywords go to argparse (metavar; action="append")."""
    meta = dict(
        help=help, check=check, kind=kind, record=record, resume=resume, group=group, name=name
    )
    return dataclasses.field(default=default, metadata={**meta, "argparse": argparse_kwargs})


def at_least(n):
    return lambda v: v is None or v >= n or f"must be >= {n}"


def above(n):
    return lambda v: v is None or v > n or f"must be > {n}"


def fraction(v):
    return v is None or 0 <= v < 1 or "must be in [0, 1)"


def one_of(*choices):
    return lambda v: v in choices or f"must be {', '.join(map(str, choices[:-1]))} or {choices[-1]}"


VERBOSE = one_of("auto", "0", "1", "2")


def ema_option(group=None):
    """--ema, of the commands whose optimizer can keep a moving average of the weights."""
    return option(
        None,
        "evaluate and save the moving average of the weights with this momentum, e.g. "
        "0.999 (default: off)",
        kind=float,
        check=fraction,
        metavar="MOMENTUM",
        name="--ema",
        group=group,
    )


def flag(field):
    return field.metadata["name"] or "--" + field.name.replace("_", "-")


class _Typed(argparse.Action):
    """Stores the value and the flag typed for it, so a bad value is reported under the
    name the user typed (an alias too)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.nargs == 0:
            values = self.const
        setattr(namespace, self.dest, values)
        typed = dict(getattr(namespace, "typed_flags", {}))
        typed[self.dest] = option_string
        namespace.typed_flags = typed


def add_arguments(parser, cls):
    """The flags of `cls`'s fields."""
    groups = {}
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if meta["help"] is None:
            continue
        target = parser
        if meta["group"]:
            target = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        kwargs = {"dest": field.name, "default": field.default, "action": _Typed}
        kwargs.update(meta["argparse"])
        if field.default is False:
            kwargs.update(nargs=0, const=True)
        else:
            default_type = str if field.default is None else type(field.default)
            kwargs.setdefault("type", meta["kind"] or default_type)
        target.add_argument(flag(field), help=meta["help"], **kwargs)


def check_data_file(path, flag=None):
    """DataError unless `path` (None or "": not given) is a file; the message starts
    with `flag` when one is given."""
    prefix = f"{flag}: " if flag else ""
    if path and os.path.isdir(path):
        raise DataError(f"{prefix}data file is a directory: {path}")
    if path and not os.path.isfile(path):
        raise DataError(f"{prefix}data file not found: {path}")


def from_args(cls, args):
    """The config of parsed `args`, checked: the first field whose check fails is a
    UsageError naming its flag as typed; then the class's `check()`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.metadata["help"]}
    config, typed = cls(**values), getattr(args, "typed_flags", {})
    for field in dataclasses.fields(config):
        test, value = field.metadata["check"], getattr(config, field.name)
        problem = True if test is None else test(value)
        if problem is not True:
            raise UsageError(f"{typed.get(field.name) or flag(field)} {problem}, got {value!r}")
    config.check()
    config.typed_flags = typed  # {field: the flag typed for it} (train.rundir.resumed)
    return config


def record(config):
    """config.json's "train": every recorded field."""
    return {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.metadata["record"]
    }


def from_record(cls, train, where="config.json"):
    """The config of a recorded "train" section (--resume; `where`: the file). It must
    hold exactly the fields `record` writes: a section with others, or without some, is
    refused in one line (a run of another version of the command; there is no older
    format to read); so is a missing section (None) or one that is not an object."""
    if not isinstance(train, dict):
        raise UsageError(f'{where}: no recorded options ("train"): start a new run')
    recorded = {f.name for f in dataclasses.fields(cls) if f.metadata["record"]}
    missing, unknown = sorted(recorded - set(train)), sorted(set(train) - recorded)
    if missing or unknown:
        differ = "; ".join(
            f"{what}: {', '.join(names)}"
            for what, names in (("missing", missing), ("unknown", unknown))
            if names
        )
        raise UsageError(
            f"{where}: the recorded options are not this version's ({differ}): start a new run"
        )
    return cls(**train)


def replay_argv(cls, train):
    """The flags that set `cls`'s fields to the values `train` recorded."""
    argv = []
    for field in dataclasses.fields(cls):
        value = train.get(field.name)
        if field.metadata["help"] is None or not field.metadata["record"] or value is None:
            continue
        if isinstance(value, bool):
            argv += [flag(field)] if value else []
        elif isinstance(value, list):
            argv += [f"{flag(field)}={item}" for item in value]
        else:
            argv += [flag(field), str(value)]
    return argv
