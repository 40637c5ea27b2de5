"""`python -m train seq2seq`: train a Transformer (or Universal Transformer) seq2seq model.

Data: the embedded algorithmic tasks by default (offline: --task copy|reverse|sort|
addition|date), parallel text files (plain or .gz) --train-source/--train-target
(+ --dev-*/--test-*, else held out from train), TSV files --train-tsv (source<TAB>target),
or --dataset tfds:NAME (downloads), e.g. tfds:ted_hrlr_translate/pt_to_en, tfds:gigaword.

Writes RUN_DIR (--out): model.keras (tokenizer inside), config.json, metrics.json
(test_bleu/chrF/ROUGE for text, test_exact_match for tasks, decode speed),
calibration.npz, vocab/, checkpoints/, logs/ (TensorBoard).
"""

import argparse
import os

from train.seq2seq import length
from zoo.cli import UsageError

ARCHS = ("transformer", "universal_transformer")


def add_arguments(parser):
    p = parser
    p.add_argument(
        "--arch", default="transformer", help="transformer (default) or universal_transformer"
    )
    p.add_argument("--out", help="run directory (default runs/seq2seq-TASK or runs/seq2seq-text)")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("data")
    g.add_argument(
        "--task", default="reverse", help="embedded task: copy, reverse, sort, addition, date"
    )
    g.add_argument(
        "--task-length",
        type=int,
        default=8,
        help="longest training sequence of the task (default 8)",
    )
    g.add_argument(
        "--train-size", type=int, default=4000, help="generated training pairs (default 4000)"
    )
    for split in ("train", "dev", "test"):
        g.add_argument(
            f"--{split}-source", help=f"{split} source file (plain or .gz, one sentence a line)"
        )
        g.add_argument(f"--{split}-target", help=f"{split} target file (line i translates line i)")
        g.add_argument(f"--{split}-tsv", help=f"{split} pairs as source<TAB>target lines")
    g.add_argument("--dataset", help="tfds:NAME, e.g. tfds:ted_hrlr_translate/pt_to_en (downloads)")
    g.add_argument(
        "--vocab-size", type=int, default=6000, help="SentencePiece pieces (text; default 6000)"
    )
    g.add_argument(
        "--truncate", action="store_true", help="cut over-long pairs instead of stopping"
    )
    m = p.add_argument_group("model")
    m.add_argument("--hidden-dim", type=int)
    m.add_argument("--num-layers", type=int)
    m.add_argument("--num-heads", type=int)
    m.add_argument("--intermediate-dim", type=int)
    m.add_argument("--dropout", type=float)
    m.add_argument("--max-source-length", type=int, help="longest source in tokens")
    m.add_argument("--max-target-length", type=int, help="longest target in tokens (+EOS)")
    m.add_argument("--position", choices=("sinusoidal", "learned"), default="sinusoidal")
    m.add_argument("--post-ln", action="store_true", help="post-LN blocks (default pre-LN)")
    m.add_argument(
        "--separate-embeddings", action="store_true", help="do not tie source/target/output tables"
    )
    m.add_argument("--window", type=int, help="local attention window of the encoder (long inputs)")
    m.add_argument("--num-steps", type=int, default=4, help="Universal Transformer recurrent steps")
    m.add_argument("--act", action="store_true", help="Universal Transformer with ACT halting")
    t = p.add_argument_group("training")
    t.add_argument(
        "--epochs", type=int, help="epochs (default 30 for tasks, 40 for text; see --max-minutes)"
    )
    t.add_argument(
        "--max-minutes",
        type=float,
        default=30.0,
        help="training time budget (default 30; 0 = none)",
    )
    t.add_argument("--batch-size", type=int, default=64, help="pairs per batch (default 64)")
    t.add_argument(
        "--steps-per-epoch",
        type=int,
        help="batches between checkpoints/dev scores (default: one pass over the data)",
    )
    t.add_argument(
        "--learning-rate", type=float, help="peak learning rate (default 1e-3 text, 2e-3 tasks)"
    )
    t.add_argument(
        "--warmup-steps", type=int, help="linear warm-up steps (default 800 text, 200 tasks)"
    )
    t.add_argument("--label-smoothing", type=float, default=0.1)
    # The earlier name of --jit-compile (one XLA flag across train commands), hidden.
    t.add_argument(
        "--xla", dest="jit_compile", action="store_const", const=True, help=argparse.SUPPRESS
    )
    e = p.add_argument_group("evaluation")
    e.add_argument(
        "--beam-width", type=int, help="beam width for the test set (default 4 text, 1 tasks)"
    )
    e.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default 0.6)")
    e.add_argument(
        "--dev-sample", type=int, default=300, help="dev pairs decoded after each epoch (0 = none)"
    )
    e.add_argument("--verbose", default="auto", help="Keras progress output: auto, 0, 1, 2")
    length.add_length_arguments(p)


def _positive(name, value, allow_zero=False):
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise UsageError(f"--{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(args):
    from train.seq2seq.algorithmic import TASKS

    if args.arch not in ARCHS:
        raise UsageError(f"unknown arch {args.arch!r}; choose from: {', '.join(ARCHS)}")
    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}; choose from: {', '.join(TASKS)}")
    for name in (
        "task_length",
        "train_size",
        "vocab_size",
        "hidden_dim",
        "num_layers",
        "num_heads",
        "intermediate_dim",
        "max_source_length",
        "max_target_length",
        "window",
        "num_steps",
        "epochs",
        "batch_size",
        "learning_rate",
        "beam_width",
        "steps_per_epoch",
    ):
        _positive(name.replace("_", "-"), getattr(args, name))
    for name in ("max_minutes", "warmup_steps", "dev_sample", "alpha"):
        _positive(name.replace("_", "-"), getattr(args, name), allow_zero=True)
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UsageError(f"--dropout must be in [0, 1), got {args.dropout}")
    if not 0 <= args.label_smoothing < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    # --jit-compile (or --xla): XLA for the compiled model and the training steps.
    args.xla = getattr(args, "jit_compile", None) is True
    if args.verbose not in ("auto", "0", "1", "2"):
        raise UsageError(f"--verbose must be auto, 0, 1 or 2, got {args.verbose!r}")
    args.verbose = args.verbose if args.verbose == "auto" else int(args.verbose)
    for flag in (
        "train_source",
        "train_target",
        "dev_source",
        "dev_target",
        "test_source",
        "test_target",
        "train_tsv",
        "dev_tsv",
        "test_tsv",
    ):
        path = getattr(args, flag)
        if path and os.path.isdir(path):
            raise UsageError(f"--{flag.replace('_', '-')}: data file is a directory: {path}")
        if path and not os.path.isfile(path):
            raise UsageError(f"--{flag.replace('_', '-')}: data file not found: {path}")
    text = bool(args.dataset or args.train_source or args.train_tsv)
    if args.out is None:
        args.out = os.path.join("runs", "seq2seq-text" if text else f"seq2seq-{args.task}")


def run(args):
    validate(args)
    if args.compare:
        return length.run_compare(args)
    from train import rundir

    rundir.check_out_dir(args.out, resume=args.resume, kinds=("seq2seq", "universal_transformer"))
    if args.resume:
        from zoo.cli import import_keras_quietly

        import_keras_quietly()  # after the cheap checks: bad input still gets one line
        from train.seq2seq import training as seq2seq_run

        return seq2seq_run.resume_run(args)
    # Input problems are found before the (slow) TensorFlow import and before anything is written.
    from train.seq2seq.data import load_data

    data = load_data(args)
    from train.seq2seq import training as seq2seq_run

    return seq2seq_run.train_new(args, data)
