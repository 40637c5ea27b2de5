"""Length generalisation: `python -m train universal_transformer --task reverse --compare`.

Trains the Transformer, the Universal Transformer and the UT with ACT on the same
generated data and budget, for `--seeds` seeds each, then decodes test sets of lengths
in the trained range and 2x, 5x, 10x the longest trained length (`--train-lengths`,
`--test-lengths`) and reports, per length bucket, character accuracy and whole-sequence
accuracy (mean and standard deviation over seeds) in `metrics.json`, `compare.md` and
a plot of accuracy against length (`accuracy_by_length.png`). Each arm is an ordinary
run directory (`ARM_seedS/`) that `zoo.load` and `python -m export` take.
"""

import copy
import os
import re

from zoo import atomic
from zoo.cli import UsageError
from zoo.litert import bucket

# Each arm's --arch and --act.
_ARM_OPTIONS = {
    "transformer": ("transformer", False),
    "universal_transformer": ("universal_transformer", False),
    "universal_transformer_act": ("universal_transformer", True),
}
ARMS = tuple(_ARM_OPTIONS)
# The default protocol: strings of lengths 1-20, each arm 10 epochs of 300 batches of 64
# (unless --epochs / --steps-per-epoch are given), about 12 minutes an arm on a 2-core CPU.
TRAIN_LENGTHS = (1, 20)
EPOCHS, STEPS_PER_EPOCH = 10, 300
# What each bucket reports (`score`), and its name in the table and the plot.
MEASURES = {"char_accuracy": "character accuracy", "seq_accuracy": "whole-sequence accuracy"}


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


def test_ranges(args):
    """The test buckets: the trained range first, then --test-lengths (or 2x, 5x, 10x)."""
    lo, hi = TRAIN_LENGTHS
    if args.train_lengths:
        lo, hi = parse_range(args.train_lengths, "--train-lengths")
    if args.test_lengths:
        extra = [parse_range(part, "--test-lengths") for part in args.test_lengths.split(",")]
    else:
        extra = [(k * hi, k * hi) for k in (2, 5, 10)]
    return [(lo, hi)] + extra


def bucket_name(lo, hi, trained_hi):
    length = str(lo) if lo == hi else f"{lo}-{hi}"
    if (lo, hi) != (lo, trained_hi) and hi % trained_hi == 0 and lo == hi:
        return f"{hi // trained_hi}x ({length})"
    return length


def score(outputs, references):
    """(characters right, characters, whole strings right): character i of a reference
    counts as right when the output has the same character at i (a missing or extra
    tail counts against it: shorter outputs lose the rest, longer ones nothing more)."""
    chars = sum(
        sum(1 for i, c in enumerate(r) if i < len(o) and o[i] == c)
        for o, r in zip(outputs, references)
    )
    return chars, sum(len(r) for r in references), sum(o == r for o, r in zip(outputs, references))


def evaluate_buckets(model, buckets, first=None):
    """Greedy outputs for every bucket: [{bucket, lo, hi, char_accuracy, seq_accuracy,
    examples}], each bucket a list of (source, target) pairs; `first`: the first
    bucket's outputs when they are decoded already (a run's test set)."""
    results = []
    for k, (name, lo, hi, pairs) in enumerate(buckets):
        if k == 0 and first is not None:
            outputs = first
        else:
            outputs = model.translate([s for s, _ in pairs])
        refs = [t for _, t in pairs]
        right, total, exact = score(outputs, refs)
        results.append(
            {
                "bucket": name,
                "lo": lo,
                "hi": hi,
                "char_accuracy": round(right / max(1, total), 4),
                "seq_accuracy": round(exact / max(1, len(pairs)), 4),
                "examples": len(pairs),
                "sample": {"source": pairs[0][0], "reference": refs[0], "output": outputs[0]},
            }
        )
    return results


def compare_data(args):
    """The shared training data and the test buckets, the first the trained range (one
    data seed: --seed)."""
    from train.seq2seq.data import embedded

    ranges = test_ranges(args)
    data, tests = embedded(args, ranges, args.eval_size, train_lengths=list(ranges[0]))
    hi = ranges[0][1]
    buckets = [(bucket_name(a, b, hi), a, b, pairs) for (a, b), pairs in zip(ranges, tests)]
    return data, buckets


def model_lengths(buckets):
    """(max_source_length, max_target_length) that fit every tested string
    (characters are the tokens), rounded up to multiples of 8."""
    source = max(len(s) for _, _, _, pairs in buckets for s, _ in pairs)
    target = max(len(t) for _, _, _, pairs in buckets for _, t in pairs)
    return bucket(source), bucket(target + 1)


def summarize(rows, arms, buckets):
    """Per arm and bucket: mean and sample standard deviation over seeds."""
    from train.progress import mean_and_std

    summary = []
    for arm in arms:
        runs = [r for r in rows if r["arm"] == arm]
        for i, (name, lo, hi, _) in enumerate(buckets):
            entry = {"arm": arm, "bucket": name, "lo": lo, "hi": hi, "seeds": len(runs)}
            for key in MEASURES:
                values = [r["length"][i][key] for r in runs]
                entry[key] = values
                entry.update(mean_and_std(key, values))
            summary.append(entry)
    return summary


def summary_table(summary):
    lines = [
        "| arm | length | seeds | " + " | ".join(MEASURES.values()) + " |",
        "|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['arm']} | {e['bucket']} | {e['seeds']} | "
            f"{e['char_accuracy_mean']:.3f} ± {e['char_accuracy_std']:.3f} | "
            f"{e['seq_accuracy_mean']:.3f} ± {e['seq_accuracy_std']:.3f} |"
        )
    return "\n".join(lines)


def plot(summary, arms, path, title):
    """Accuracy against the tested length (bucket midpoints), one line per arm,
    mean ± standard deviation over seeds; character and whole-sequence panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for axis, (key, label) in zip(axes, MEASURES.items()):
        for arm in arms:
            entries = [e for e in summary if e["arm"] == arm]
            x = [(e["lo"] + e["hi"]) / 2 for e in entries]
            axis.errorbar(
                x,
                [e[f"{key}_mean"] for e in entries],
                yerr=[e[f"{key}_std"] for e in entries],
                marker="o",
                capsize=3,
                label=arm,
            )
        axis.set_xscale("log")
        axis.set_xlabel("string length")
        axis.set_title(label)
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[1].legend(loc="lower left", fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    with atomic.building(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
    plt.close(figure)


def run_compare(context, args):
    """`--compare`: every arm and seed in `context`, then the per-length table and plot."""
    test_ranges(args)  # --train-lengths first
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ARMS:
            raise UsageError(f"unknown arm {arm!r} in --arms; choose from: {', '.join(ARMS)}")
    if not arms:
        raise UsageError(f"--arms names no arm, got {args.arms!r}")
    args.arms = ",".join(arms)
    from train import rundir

    if args.resume:
        raise UsageError("--compare cannot be combined with --resume")
    if args.task not in ("copy", "reverse", "sort", "addition"):
        raise UsageError(f"--compare needs --task copy, reverse, sort or addition, got {args.task}")
    data, buckets = rundir.prepare(args, (), compare_data)
    from train.progress import markdown_table
    from train.seq2seq import config, training
    from zoo import atomic

    max_source, max_target = model_lengths(buckets)
    rundir.create_run_dir(args.out, "seq2seq-compare")
    rows = []
    for k in range(args.seeds):
        for arm in arms:
            arm_args = copy.copy(args)
            arm_args.compare = False
            arm_args.arch, arm_args.act = _ARM_OPTIONS[arm]
            arm_args.seed = args.seed + k
            arm_args.dev_sample = min(args.dev_sample, args.eval_size)
            arm_args.recipe = config.recipe(args, text=False)  # every arm the same
            if args.epochs is None and args.steps_per_epoch is None:
                arm_args.epochs, arm_args.steps_per_epoch = EPOCHS, STEPS_PER_EPOCH
            # Every tested string must fit the model (characters are the tokens).
            arm_args.max_source_length = args.max_source_length or max_source
            arm_args.max_target_length = args.max_target_length or max_target
            name = f"{arm}_seed{arm_args.seed}"
            arm_args.out = os.path.join(args.out, name)
            print(f"\n=== {name} ===", flush=True)
            # The test set is the first bucket: its outputs are decoded once.
            model, greedy = training.train_new(context, arm_args, data)
            results = evaluate_buckets(model, buckets, first=greedy)
            metrics = rundir.load_json(os.path.join(arm_args.out, "metrics.json"))
            metrics["length"] = results
            atomic.write_json(os.path.join(arm_args.out, "metrics.json"), metrics)
            row = {"name": name, "arm": arm, "seed": arm_args.seed, "length": results}
            rows.append({**row, "train_seconds": metrics["train_seconds"]})
            columns = [("bucket", "length"), ("char_accuracy", "char"), ("seq_accuracy", "seq")]
            print(markdown_table(results, columns), flush=True)
    summary = summarize(rows, arms, buckets)
    _, lo, hi, _ = buckets[0]  # the trained range
    title = (
        f"{args.task}: trained on lengths {lo}-{hi}, {args.seeds} seed(s) per arm "
        "(mean ± standard deviation)"
    )
    plot(summary, arms, os.path.join(args.out, "accuracy_by_length.png"), title)
    text = f"# {title}\n\n{summary_table(summary)}\n"
    atomic.write_text(os.path.join(args.out, "compare.md"), text)
    atomic.write_json(
        os.path.join(args.out, "metrics.json"),
        {
            "task": args.task,
            "train_lengths": [lo, hi],
            "buckets": [{"bucket": n, "lo": a, "hi": b} for n, a, b, _ in buckets],
            "data": data.source,
            "summary": summary,
            "runs": rows,
        },
    )
    print(f"\n{text}")
    return 0
