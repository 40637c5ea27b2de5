"""`python -m train seq2seq`: train a Transformer (or Universal Transformer) seq2seq model.

Data: the embedded algorithmic tasks by default (offline: --task copy|reverse|sort|
addition|date), parallel text files (plain or .gz) --train-source/--train-target
(+ --dev-*/--test-*, else held out from train), TSV files --train-tsv (source<TAB>target),
or --dataset tfds:NAME (downloads), e.g. tfds:ted_hrlr_translate/pt_to_en, tfds:gigaword.

Writes RUN_DIR (--out): model.keras (tokenizer inside), config.json, metrics.json
(test_bleu/chrF/ROUGE for text, test_exact_match for tasks, decode speed),
calibration.npz, vocab/, checkpoints/, logs/ (TensorBoard).
"""

import dataclasses
import os

# Not `config`: the submodule train.seq2seq.config takes that name in this package.
from train import config as options
from train.config import VERBOSE, above, at_least, ema_option, fraction, one_of, option
from train.seq2seq import length
from zoo.cli import UsageError

ARCHS = ("transformer", "universal_transformer")
FILES = [
    f"{split}_{part}" for split in ("train", "dev", "test") for part in ("source", "target", "tsv")
]


def _file(name):
    split, part = name.split("_")
    if part == "tsv":
        return f"{split} pairs as source<TAB>target lines"
    if part == "source":
        return f"{split} source file (plain or .gz, one sentence a line)"
    return f"{split} target file (line i translates line i)"


@dataclasses.dataclass
class Seq2SeqConfig:
    """The options of `python -m train seq2seq` and `universal_transformer` (train.config)."""

    arch: str = option("transformer", "transformer (default) or universal_transformer")
    out: str = option(
        None, "run directory (default runs/seq2seq-TASK or runs/seq2seq-text)", record=False
    )
    resume: bool = option(False, "continue the run in --out from its last checkpoint", record=False)
    seed: int = option(0, "random seed (default 0)")
    task: str = option(
        "reverse", "embedded task: copy, reverse, sort, addition, date", group="data"
    )
    task_length: int = option(
        8, "longest training sequence of the task (default 8)", check=above(0), group="data"
    )
    train_size: int = option(
        4000, "generated training pairs (default 4000)", check=above(0), group="data"
    )
    train_source: str = option(None, _file("train_source"), group="data")
    train_target: str = option(None, _file("train_target"), group="data")
    train_tsv: str = option(None, _file("train_tsv"), group="data")
    dev_source: str = option(None, _file("dev_source"), group="data")
    dev_target: str = option(None, _file("dev_target"), group="data")
    dev_tsv: str = option(None, _file("dev_tsv"), group="data")
    test_source: str = option(None, _file("test_source"), group="data")
    test_target: str = option(None, _file("test_target"), group="data")
    test_tsv: str = option(None, _file("test_tsv"), group="data")
    dataset: str = option(
        None, "tfds:NAME, e.g. tfds:ted_hrlr_translate/pt_to_en (downloads)", group="data"
    )
    vocab_size: int = option(
        6000, "SentencePiece pieces (text; default 6000)", check=above(0), group="data"
    )
    truncate: bool = option(False, "cut over-long pairs instead of stopping", group="data")
    hidden_dim: int = option(None, "model width", kind=int, check=above(0), group="model")
    num_layers: int = option(None, "layers", kind=int, check=above(0), group="model")
    num_heads: int = option(None, "attention heads", kind=int, check=above(0), group="model")
    intermediate_dim: int = option(
        None, "feed-forward width", kind=int, check=above(0), group="model"
    )
    dropout: float = option(None, "dropout rate", kind=float, check=fraction, group="model")
    max_source_length: int = option(
        None, "longest source in tokens", kind=int, check=above(0), group="model"
    )
    max_target_length: int = option(
        None, "longest target in tokens (+EOS)", kind=int, check=above(0), group="model"
    )
    position: str = option(
        "sinusoidal",
        "sinusoidal (default) or learned positions",
        check=one_of("sinusoidal", "learned"),
        group="model",
    )
    post_ln: bool = option(False, "post-LN blocks (default pre-LN)", group="model")
    separate_embeddings: bool = option(
        False, "do not tie source/target/output tables", group="model"
    )
    window: int = option(
        None,
        "local attention window of the encoder (long inputs)",
        kind=int,
        check=above(0),
        group="model",
    )
    random_positions: bool = option(
        False,
        "train on sorted random positions up to the longest string the model takes, "
        "for inputs longer than the trained ones (sinusoidal positions)",
        group="model",
    )
    source_positions: str = option(
        "start",
        "count the source's positions from its start (default) or half the features "
        "from each end (both_ends; sinusoidal positions)",
        check=one_of("start", "both_ends"),
        group="model",
    )
    cross_length_scale: str = option(
        "auto",
        "cross-attention grows sharper beyond this many source tokens (log-length "
        "scaling, for inputs longer than the trained ones): auto (the longest trained "
        "source, default), off, or a number >= 2",
        check=lambda v: (
            v in ("auto", "off")
            or (v.isdigit() and int(v) >= 2)
            or "must be auto, off or an integer >= 2"
        ),
        group="model",
    )
    recipe: str = option(
        "auto",
        "length: random positions, both-ends source positions and hidden size 128 "
        "(unless --hidden-dim), the settings that carry to strings longer than the "
        "trained ones; plain: the model flags as given; auto (default): length for "
        "universal_transformer on an embedded task and for --compare, else plain",
        check=one_of("auto", "length", "plain"),
        group="model",
    )
    num_steps: int = option(
        4, "Universal Transformer recurrent steps", check=above(0), group="model"
    )
    act: bool = option(False, "Universal Transformer with ACT halting", group="model")
    epochs: int = option(
        None,
        "epochs (default 30 for tasks, 40 for text; see --max-minutes)",
        kind=int,
        check=above(0),
        group="training",
        resume=True,
    )
    max_minutes: float = option(
        30.0, "training time budget (default 30; 0 = none)", check=at_least(0), group="training"
    )
    batch_size: int = option(64, "pairs per batch (default 64)", check=above(0), group="training")
    steps_per_epoch: int = option(
        None,
        "batches between checkpoints/dev scores (default: one pass over the data)",
        kind=int,
        check=above(0),
        group="training",
    )
    learning_rate: float = option(
        None,
        "peak learning rate (default 1e-3 text, 2e-3 tasks)",
        kind=float,
        check=above(0),
        group="training",
    )
    warmup_steps: int = option(
        None,
        "linear warm-up steps (default 800 text, 200 tasks)",
        kind=int,
        check=at_least(0),
        group="training",
    )
    schedule: str = option(
        "auto",
        "learning rate after the warm-up: inverse_sqrt, or cosine (down to zero at the "
        "last epoch's end or the end of --max-minutes, whichever comes first); auto "
        "(default): cosine for embedded tasks, inverse_sqrt for text",
        check=one_of("auto", "inverse_sqrt", "cosine"),
        group="training",
    )
    label_smoothing: float = option(
        0.1, "label smoothing (default 0.1)", check=fraction, group="training"
    )
    ema_momentum: float = ema_option(group="training")
    average_last: int = option(
        None,
        "end with the mean of the last K epochs' weights where its dev token accuracy is at "
        "least the best epoch's (default 3 text, 1 tasks; 1: the best epoch's weights); "
        "--resume of a finished run with another K re-evaluates it with the epochs kept",
        kind=int,
        check=at_least(1),
        metavar="K",
        group="training",
        resume=True,
    )
    beam_width: int = option(
        None,
        "beam width for the test set (default 4 text, 1 tasks)",
        kind=int,
        check=above(0),
        group="evaluation",
    )
    alpha: float = option(
        0.6, "length penalty exponent (default 0.6)", check=at_least(0), group="evaluation"
    )
    dev_sample: int = option(
        300,
        "dev pairs decoded after each epoch (0 = none)",
        check=at_least(0),
        group="evaluation",
    )
    verbose: str = option(
        "auto",
        "Keras progress output: auto, 0, 1, 2",
        check=VERBOSE,
        group="evaluation",
        resume=True,
    )
    # Length generalisation (train/seq2seq/length.py).
    compare: bool = option(
        False,
        "train the Transformer, the UT and the UT with ACT on the same data and budget "
        "(--seeds each) and report accuracy by length (metrics.json, compare.md, a plot)",
        record=False,
        group="length generalisation",
    )
    train_lengths: str = option(
        None,
        "--compare: trained lengths A-B (default 1-20; for addition, digits of the first number)",
        group="length generalisation",
    )
    test_lengths: str = option(
        None,
        "--compare: comma-separated test lengths or ranges A-B (default: 2x, 5x and "
        "10x the longest trained length); the trained range is always tested too",
        group="length generalisation",
    )
    seeds: int = option(
        3, "--compare: seeds per arm (default 3)", check=above(0), group="length generalisation"
    )
    eval_size: int = option(
        100,
        "--compare: test strings per length bucket (default 100)",
        check=above(0),
        group="length generalisation",
    )
    arms: str = option(
        ",".join(length.ARMS),
        f"--compare: comma-separated arms (default {','.join(length.ARMS)})",
        group="length generalisation",
    )

    def check(self):
        from train.seq2seq.algorithmic import TASKS

        if self.arch not in ARCHS:
            raise UsageError(f"unknown arch {self.arch!r}; choose from: {', '.join(ARCHS)}")
        if self.task not in TASKS:
            raise UsageError(f"unknown task {self.task!r}; choose from: {', '.join(TASKS)}")
        if self.position != "sinusoidal" and (
            self.random_positions or self.source_positions != "start"
        ):
            raise UsageError("--random-positions and --source-positions need --position sinusoidal")
        if self.position != "sinusoidal" and self.recipe == "length":
            raise UsageError("--recipe length needs --position sinusoidal (or --recipe plain)")
        for name in FILES:
            options.check_data_file(getattr(self, name), "--" + name.replace("_", "-"))
        if self.out is None:
            text = self.dataset or self.train_source or self.train_tsv
            self.out = os.path.join("runs", "seq2seq-text" if text else f"seq2seq-{self.task}")


CONFIG = Seq2SeqConfig


def run(args, context):
    cfg = options.from_args(Seq2SeqConfig, args)
    if cfg.compare:
        return length.run_compare(context, cfg)
    from train import rundir
    from train.seq2seq.data import load_data

    data = rundir.prepare(cfg, ("seq2seq", "universal_transformer"), load_data)
    from train.seq2seq import training

    if cfg.resume:
        training.resume_run(context, cfg)
    else:
        training.train_new(context, cfg, data)
    return 0
