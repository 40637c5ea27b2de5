"""Length generalisation, one position option at a time.

    python -m benchmarks.length_ablation --task reverse [--only ut,ut_with_both] [--seeds 1]

Each variant is a model config (below) trained for a fixed number of steps on the same
generated data (lengths 1-20 by default) and decoded greedily at the trained lengths and
at 2x and 10x the longest (`train.seq2seq.length`'s buckets and scores). A plain Keras
`fit` with the seq2seq loss, metric and schedule (`train.seq2seq.fit.compile_seq2seq`):
the variants differ in model options that `python -m train` does not all take as flags.
Results are merged into --out (JSON, one entry per variant and seed) and printed as a
Markdown table, so variants can be run one at a time.
"""

import argparse
import itertools
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The two position options (`random_positions`, `source_positions="both_ends"`), alone
# and together, on the Universal Transformer (with and without ACT) and on the
# Transformer as `python -m train seq2seq` builds it; both options are off by default.
BOTH = {"random_positions": True, "source_positions": "both_ends"}
VARIANTS = {
    "ut": ("universal_transformer", {}),
    "ut_random_positions": ("universal_transformer", {"random_positions": True}),
    "ut_both_ends": ("universal_transformer", {"source_positions": "both_ends"}),
    "ut_with_both": ("universal_transformer", BOTH),
    "ut_act_with_both": ("universal_transformer", {"act": True, **BOTH}),
    "transformer": ("seq2seq", {"num_layers": 2}),
    "transformer_with_both": ("seq2seq", {"num_layers": 2, **BOTH}),
}


def train_variant(name, data, buckets, args, seed):
    import keras
    import tensorflow as tf

    import zoo
    import zoo.models  # noqa: F401
    from train.buckets import Batches
    from train.seq2seq import length
    from train.seq2seq.data import Encoded, train_tokenizer
    from train.seq2seq.fit import compile_seq2seq
    from train.seq2seq.parallel import ParallelData
    from zoo.seq2seq.tokenization import Tokenizer, encode_proto

    kind, options = VARIANTS[name]
    keras.utils.set_random_seed(seed)
    proto = train_tokenizer(ParallelData(data, [], [], {}, task=args.task), 64)
    tokenizer = Tokenizer(proto)
    max_source, max_target = length.model_lengths(buckets)
    config = dict(
        hidden_dim=64,
        num_heads=4,
        intermediate_dim=args.intermediate_dim,
        dropout=0.0,
        label_smoothing=0.1,
        max_source_length=max_source,
        max_target_length=max_target,
    )
    config.update(options)
    model = zoo.build(kind, tokenizer=encode_proto(proto), **config)
    compile_seq2seq(model, 2e-3, 200, 0.1, jit_compile=None)
    encoded = Encoded(tokenizer, data, max_source, max_target, "train")

    def endless():  # a new shuffle every pass over the data
        for epoch in itertools.count():
            yield from Batches(encoded, 64, seed=seed + epoch)

    spec = tf.TensorSpec([None, None], tf.int32)
    signature = ({"source_ids": spec, "target_ids": spec}, spec)
    batches = tf.data.Dataset.from_generator(endless, output_signature=signature).prefetch(2)
    started = time.perf_counter()
    model.fit(batches, epochs=1, steps_per_epoch=args.steps, verbose=0)
    seconds = time.perf_counter() - started
    results = length.evaluate_buckets(model, buckets)
    return {
        "variant": name,
        "kind": kind,
        "options": options,
        "seed": seed,
        "steps": args.steps,
        "train_seconds": round(seconds, 1),
        "length": results,
    }


def table(entries):
    lines = []
    buckets = [r["bucket"] for r in entries[0]["length"]] if entries else []
    head = " | ".join(f"{b} char | {b} seq" for b in buckets)
    lines.append(f"| variant | seed | steps | {head} |")
    lines.append("|---|---|---|" + "---|" * (2 * len(buckets)))
    for e in entries:
        cells = " | ".join(
            f"{r['char_accuracy']:.3f} | {r['seq_accuracy']:.2f}" for r in e["length"]
        )
        lines.append(f"| {e['variant']} | {e['seed']} | {e['steps']} | {cells} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="reverse", choices=("copy", "reverse", "sort", "addition"))
    p.add_argument("--train-lengths", default="1-20")
    p.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--intermediate-dim", type=int, default=128)
    p.add_argument("--train-size", type=int, default=20000)
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--out", default="length_ablation.json")
    args = p.parse_args(argv)
    from train.seq2seq import length

    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    # The buckets of `python -m train seq2seq --compare` at 2x and 10x, data seed 0.
    hi = length.parse_range(args.train_lengths, "--train-lengths")[1]
    data_args = argparse.Namespace(**vars(args), seed=0, test_lengths=f"{2 * hi},{10 * hi}")
    parallel, buckets = length.compare_data(data_args)
    data = parallel.train
    found = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            found = json.load(f)
    for name in names:
        for seed in range(args.seeds):
            entry = train_variant(name, data, buckets, args, seed)
            entry["task"] = args.task
            found = [
                e
                for e in found
                if (e["variant"], e["seed"], e.get("task")) != (name, seed, args.task)
            ]
            found.append(entry)
            with open(args.out, "w") as f:
                json.dump(found, f, indent=1)
            print(table([entry]), flush=True)
    print(table([e for e in found if e.get("task") == args.task]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
