"""`python -m train tagger`: train a part-of-speech tagger, or --compare all four archs.

Data: the embedded generated grammar by default (offline), CoNLL-U files
(--train-file/--dev-file/--test-file), or --dataset tfds:NAME (downloads).
"""

import argparse
import json
import os

from zoo.cli import UsageError
from zoo.tagger.config import ARCHS


class _Named(argparse.Action):
    """Stores the value and the flag that gave it (`args.<dest>_flag`), so a bad
    value is reported under the name the user typed."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def add_arguments(parser):
    parser.add_argument(
        "--arch", default="attention", help=f"one of {', '.join(ARCHS)} (default attention)"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="total epochs (default 5 on the embedded data, 40 on files; see --max-minutes)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="sentences per batch (default 32)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="run directory (default runs/tagger-ARCH or runs/tagger-compare)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (model and embedded data)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    parser.add_argument("--train-file", help="CoNLL-U training file (UPOS column)")
    parser.add_argument("--dev-file", help="CoNLL-U dev file (default: 10%% held out from train)")
    parser.add_argument("--test-file", help="CoNLL-U test file (default: 10%% held out from train)")
    parser.add_argument(
        "--dataset", help="tfds:NAME, e.g. tfds:universal_dependencies/en_ewt (downloads)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="train all four archs on the same data; print and save a comparison table",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=20.0,
        help="stop training an arch after this many minutes (default 20; 0 = no limit)",
    )
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="peak learning rate (default per arch)"
    )
    parser.add_argument(
        "--ema",
        dest="ema_momentum",
        type=float,
        default=None,
        metavar="MOMENTUM",
        action=_Named,
        help="evaluate and save the moving average of the weights with this "
        "momentum, e.g. 0.995 (default: off)",
    )
    # The earlier name, kept working (hidden): one EMA flag across train commands.
    parser.add_argument(
        "--ema-momentum", dest="ema_momentum", type=float, action=_Named, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--verbose",
        default="auto",
        help="Keras progress output: auto (bars on a terminal, a line per epoch "
        "otherwise), 0, 1, 2",
    )
    parser.add_argument(
        "--model-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tagger hyper-parameter, e.g. hidden_dim=192 (JSON values; repeatable)",
    )


def _validate(args):
    if args.compare and args.resume:
        raise UsageError("--compare cannot be combined with --resume")
    if args.arch not in ARCHS:
        raise UsageError(f"unknown arch {args.arch!r}; choose from: {', '.join(ARCHS)}")
    if args.epochs is not None and args.epochs < 0:
        raise UsageError(f"--epochs must be >= 0, got {args.epochs}")
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be > 0, got {args.batch_size}")
    if args.max_minutes < 0:
        raise UsageError(f"--max-minutes must be >= 0, got {args.max_minutes}")
    if args.learning_rate is not None and not args.learning_rate > 0:
        raise UsageError(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.ema_momentum is not None and not 0 <= args.ema_momentum < 1:
        flag = getattr(args, "ema_momentum_flag", None) or "--ema"
        raise UsageError(f"{flag} must be in [0, 1), got {args.ema_momentum}")
    verbose = getattr(args, "verbose", "auto")
    if verbose not in ("auto", "0", "1", "2", 0, 1, 2):
        raise UsageError(f"--verbose must be auto, 0, 1 or 2, got {verbose!r}")
    args.verbose = verbose if verbose == "auto" else int(verbose)
    args.model_options = _model_options(args.model_option)
    for path in (args.train_file, args.dev_file, args.test_file):
        if path and os.path.isdir(path):
            raise UsageError(f"data file is a directory: {path}")
        if path and not os.path.isfile(path):
            raise UsageError(f"data file not found: {path}")
    if args.out is None:
        args.out = os.path.join("runs", "tagger-compare" if args.compare else f"tagger-{args.arch}")


def _model_options(items):
    options = {}
    if not items:
        return options
    from zoo.tagger.config import DEFAULTS

    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in DEFAULTS:
            raise UsageError(
                f"--model-option must be KEY=VALUE with KEY in {sorted(DEFAULTS)}: {item!r}"
            )
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def run(args):
    _validate(args)
    from train import rundir

    rundir.check_out_dir(args.out, resume=args.resume, kinds=("tagger",))
    if args.resume:
        from zoo.cli import import_keras_quietly

        import_keras_quietly()  # after the cheap checks: bad input still gets one line
        from train.tagger.training import resume_run

        return resume_run(args)
    # Everything that can be wrong with the input is found before anything is written.
    from train.tagger.select import load_data

    data = load_data(args.train_file, args.dev_file, args.test_file, args.dataset, args.seed)
    from zoo.cli import import_keras_quietly

    import_keras_quietly()  # after the cheap checks: bad input still gets one line
    from train.tagger.training import train_compare, train_one

    if args.compare:
        return train_compare(args, data)
    return train_one(args, data, args.arch, args.out)
