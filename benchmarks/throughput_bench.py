"""Training throughput of the engine (train/engine.py): XLA on/off x length bucketing on/off.

    python -m benchmarks.throughput_bench [--quick] [tagger] [seq2seq]

For the tagger (embedded grammar) and the seq2seq Transformer (the `sort` task, lengths
1..max), each configuration trains on the same examples through `train.model_step.TfModelStep`
(the loop every `python -m train` command uses), one device:
  bucketed    the run code's batches: similar lengths together, widths rounded up to 8
  unbucketed  random batches, every one padded to the longest example of the data
First pass: traces and (XLA) compiles every batch shape, reported as `warmup_s`. Then
timed passes; `tokens_per_s` counts real (non-padding) tokens: target tokens for seq2seq.
"""

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def _tagger(quick):
    import zoo
    from train.buckets import Batches
    from train.tagger import embedded
    from train.tagger.data import build_vocab
    from train.tagger.fit import compile_tagger
    from train.tagger.training import MAX_CHARS, _encode

    data = embedded.generate(seed=0, train_size=256 if quick else 1024, dev_size=8, test_size=8)
    words, chars, tags = build_vocab(data)

    def build():
        keras.utils.set_random_seed(0)
        model = zoo.build(
            "tagger",
            words=words,
            chars=chars,
            tags=tags,
            arch="attention",
            max_chars=MAX_CHARS,
            max_len=256,
            hidden_dim=64,
            num_layers=2,
            num_heads=4,
        )
        compile_tagger(model, 1e-3, total_steps=1000, warmup_steps=10, weight_decay=1e-4)
        return model

    encoded = _encode(build(), data)["train"]
    batch_size = 32
    bucketed = list(Batches(encoded, batch_size, seed=0))
    longest = int(encoded.lengths.max())
    order = np.random.default_rng(0).permutation(len(encoded))
    unbucketed = [
        encoded.batch(list(order[i : i + batch_size]), multiple=longest)
        for i in range(0, len(order), batch_size)
    ]
    tokens = int(encoded.lengths.sum())
    return build, {"bucketed": bucketed, "unbucketed": unbucketed}, tokens, None


def _seq2seq(quick):
    import zoo
    from train.buckets import Batches
    from train.seq2seq import algorithmic, parallel
    from train.seq2seq.data import Encoded, train_tokenizer
    from zoo.seq2seq.tokenization import PAD_ID, Tokenizer, encode_proto

    train, dev, (test,) = algorithmic.splits(
        "sort", 256 if quick else 1024, (1, 32), [(1, 32)], 300, seed=0
    )
    data = parallel.ParallelData(train, dev, test, {"name": "embedded"}, task="sort")
    proto = train_tokenizer(data, 64)
    tokenizer = Tokenizer(proto)

    def build():
        from train.seq2seq.fit import compile_seq2seq

        keras.utils.set_random_seed(0)
        model = zoo.build(
            "seq2seq",
            tokenizer=encode_proto(proto),
            hidden_dim=64,
            num_layers=2,
            num_heads=4,
            intermediate_dim=256,
            dropout=0.0,
            max_source_length=64,
            max_target_length=64,
        )
        compile_seq2seq(model, 1e-3, 100, 0.1, jit_compile=False)
        return model

    model0 = build()
    encoded = Encoded(
        tokenizer, data.train, model0.max_source_length, model0.max_target_length, "train"
    )
    batch_size = 64
    bucketed = list(Batches(encoded, batch_size, seed=0))
    s_max = max(len(s) for s in encoded.sources)
    t_max = max(len(t) for t in encoded.targets) + 1
    order = np.random.default_rng(0).permutation(len(encoded))
    unbucketed = [
        encoded.batch(order[i : i + batch_size], (s_max, t_max))
        for i in range(0, len(order), batch_size)
    ]
    tokens = int(sum(len(t) + 1 for t in encoded.targets))
    return build, {"bucketed": bucketed, "unbucketed": unbucketed}, tokens, PAD_ID


def _measure(build, batches, tokens, pad_id, jit, passes):
    from train.model_step import TfModelStep, masked_mean_terms

    model = build()
    terms = masked_mean_terms(model.loss, pad_id) if pad_id is not None else None
    step = TfModelStep(model, loss_terms=terms, jit_compile=jit)
    step.build(batches[0])
    started = time.perf_counter()
    for b in batches:
        step.train(b)
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(passes):
        for b in batches:
            loss = step.train(b)["loss"][0]
    seconds = time.perf_counter() - started
    shapes = len({tuple(np.shape(b[1])) for b in batches})
    padded = sum(int(np.prod(np.shape(b[1]))) for b in batches)
    return {
        "tokens_per_s": round(tokens * passes / seconds, 1),
        "warmup_s": round(warmup, 1),
        "batch_shapes": shapes,
        "padding": round(1 - tokens / padded, 3),
        "final_loss": round(loss, 3),
    }


def run(quick=False, models=("tagger", "seq2seq")):
    """Rows: model, bucketing, xla, tokens_per_s, warmup_s, batch_shapes, padding."""
    rows = []
    passes = 1 if quick else 3
    makers = {"tagger": _tagger, "seq2seq": _seq2seq}
    for name, make in ((m, makers[m]) for m in models):
        build, variants, tokens, pad_id = make(quick)
        for bucketing in ("bucketed", "unbucketed"):
            for jit in (False, True):
                row = {
                    "bench": "train_throughput",
                    "model": name,
                    "bucketing": bucketing == "bucketed",
                    "xla": jit,
                }
                row.update(_measure(build, variants[bucketing], tokens, pad_id, jit, passes))
                print(row, file=sys.stderr, flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    from train.progress import markdown_table

    chosen = [m for m in ("tagger", "seq2seq") if m in sys.argv[1:]] or ["tagger", "seq2seq"]
    result = run(quick="--quick" in sys.argv, models=chosen)
    print(
        markdown_table(
            result,
            [
                (k, k)
                for k in (
                    "model",
                    "bucketing",
                    "xla",
                    "tokens_per_s",
                    "warmup_s",
                    "batch_shapes",
                    "padding",
                )
            ],
        )
    )
