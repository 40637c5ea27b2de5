"""`python -m train tagger`: train a part-of-speech tagger, or --compare all four archs.

Data: the embedded generated grammar by default (offline), CoNLL-U files
(--train-file/--dev-file/--test-file), or --dataset tfds:NAME (downloads).
"""

import dataclasses
import json
import os

from train import config
from train.config import VERBOSE, above, at_least, ema_option, option
from zoo.cli import UsageError
from zoo.tagger.config import ARCHS, DEFAULTS


@dataclasses.dataclass
class TaggerConfig:
    """The options of `python -m train tagger` (train.config)."""

    arch: str = option("attention", f"one of {', '.join(ARCHS)} (default attention)")
    epochs: int = option(
        None,
        "total epochs (default 5 on the embedded data, 40 on files; see --max-minutes)",
        kind=int,
        check=at_least(0),
        resume=True,
    )
    batch_size: int = option(32, "sentences per batch (default 32)", check=above(0))
    out: str = option(
        None, "run directory (default runs/tagger-ARCH or runs/tagger-compare)", record=False
    )
    seed: int = option(0, "random seed (model and embedded data)")
    resume: bool = option(False, "continue the run in --out from its last checkpoint", record=False)
    train_file: str = option(None, "CoNLL-U training file (UPOS column)")
    dev_file: str = option(None, "CoNLL-U dev file (default: 10%% held out from train)")
    test_file: str = option(None, "CoNLL-U test file (default: 10%% held out from train)")
    dataset: str = option(None, "tfds:NAME, e.g. tfds:universal_dependencies/en_ewt (downloads)")
    compare: bool = option(
        False,
        "train all four archs on the same data; print and save a comparison table",
        record=False,
    )
    max_minutes: float = option(
        20.0,
        "stop training an arch after this many minutes (default 20; 0 = no limit)",
        check=at_least(0),
    )
    learning_rate: float = option(
        None, "peak learning rate (default per arch)", kind=float, check=above(0)
    )
    ema_momentum: float = ema_option()
    verbose: str = option(
        "auto",
        "Keras progress output: auto (bars on a terminal, a line per epoch otherwise), 0, 1, 2",
        check=VERBOSE,
        resume=True,
    )
    model_option: list = option(
        None,
        "tagger hyper-parameter, e.g. hidden_dim=192 (JSON values; repeatable)",
        action="append",
        metavar="KEY=VALUE",
    )

    def check(self):
        if self.compare and self.resume:
            raise UsageError("--compare cannot be combined with --resume")
        if self.arch not in ARCHS:
            raise UsageError(f"unknown arch {self.arch!r}; choose from: {', '.join(ARCHS)}")
        self.model_options()
        for path in (self.train_file, self.dev_file, self.test_file):
            config.check_data_file(path)
        if self.out is None:
            self.out = os.path.join(
                "runs", "tagger-compare" if self.compare else f"tagger-{self.arch}"
            )

    def model_options(self):
        """--model-option KEY=VALUE items as a dict (JSON values, else strings)."""
        options = {}
        for item in self.model_option or []:
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


CONFIG = TaggerConfig


def run(args, context):
    cfg = config.from_args(TaggerConfig, args)
    from train import rundir
    from train.tagger import select

    data = rundir.prepare(cfg, ("tagger",), select.load_data)
    from train.tagger.training import resume_run, train_compare, train_one

    if cfg.resume:
        return resume_run(context, cfg)
    if cfg.compare:
        return train_compare(context, cfg, data)
    return train_one(context, cfg, data, cfg.arch, cfg.out)
