"""Decoding speed: cached greedy vs full recomputation, beam 4 vs greedy.

    python -m benchmarks.decode_bench [--quick]

A d=256, 3+3-layer, 8k-vocabulary Transformer (the `python -m train seq2seq`
text default) with random weights decodes exactly 128 tokens (EOS is made
impossible through the output bias, so every decoder runs the full length).
Compared side by side in one process, all XLA-compiled (`jit_compile=True`),
after one warm-up call:
- cached greedy (`zoo.seq2seq.decoding.greedy`: encoder once, one decoder step per
  token, static KV cache, while_loop);
- uncached greedy: the same while_loop, but every step re-runs the whole
  decoder on a fixed `[B, 128]` token buffer (the usual Keras example);
- cached beam search, width 4.
The tokens of cached and uncached greedy are compared (`identical`). Targets
from the issue (measured, not asserted): cached >= 5x faster than uncached;
beam 4 <= 4x the time of greedy.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _model(quick):
    import keras
    import numpy as np

    import zoo
    from zoo.seq2seq.tokenization import EOS_ID, PAD_ID

    keras.utils.set_random_seed(0)
    dims = (
        dict(hidden_dim=128, num_layers=2, intermediate_dim=256, vocabulary_size=2000)
        if quick
        else dict(hidden_dim=256, num_layers=3, intermediate_dim=1024, vocabulary_size=8000)
    )
    model = zoo.build(
        "seq2seq",
        num_heads=4,
        dropout=0.0,
        share_embeddings=False,
        max_source_length=64,
        max_target_length=128,
        **dims,
    )
    bias = model.output_projection.bias
    value = np.asarray(bias).copy()
    # No EOS (every decoder runs the full length) and no padding id (the
    # recompute decoder would mask it as padding).
    value[[EOS_ID, PAD_ID]] = -1e4
    bias.assign(value)
    return model


def uncached_greedy(model, source_ids, max_length):
    """Full recomputation at every step, static shapes (XLA-friendly)."""
    import tensorflow as tf
    from keras import ops

    from zoo.seq2seq.tokenization import BOS_ID

    batch = ops.shape(source_ids)[0]
    buffer = ops.concatenate(
        [ops.full((batch, 1), BOS_ID, "int32"), ops.zeros((batch, max_length - 1), "int32")], axis=1
    )
    out = ops.zeros((batch, max_length), "int32")
    encoder_output, mask = model.encode(source_ids)

    def body(i, buffer, out):
        logits = model.decode(buffer, encoder_output, mask)
        step = ops.take(logits, i, axis=1)
        nxt = tf.argmax(step, axis=-1, output_type=tf.int32)
        out = ops.slice_update(out, [ops.zeros((), "int32"), i], ops.reshape(nxt, (-1, 1)))
        nxt_pos = ops.minimum(i + 1, max_length - 1)
        buffer = ops.where(
            ops.equal(ops.arange(max_length)[None, :], nxt_pos) & (i + 1 < max_length),
            ops.reshape(nxt, (-1, 1)),
            buffer,
        )
        return i + 1, buffer, out

    _, _, out = ops.while_loop(
        lambda i, *_: i < max_length, body, (ops.zeros((), "int32"), buffer, out)
    )
    return out


def _time(fn, x, repeats):
    import numpy as np

    np.asarray(fn(x))  # compile
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = np.asarray(fn(x))
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def run(quick=False):
    import numpy as np
    import tensorflow as tf

    from zoo.seq2seq import decoding

    model = _model(quick)
    length = 32 if quick else 128
    repeats = 2 if quick else 3
    rows = []
    for batch in (1, 8):
        src = (
            np.random.default_rng(1).integers(4, model.vocabulary_size, (batch, 24)).astype("int32")
        )
        cached = decoding.compiled(model, "greedy", max_length=length)
        uncached = tf.function(lambda s: uncached_greedy(model, s, length), jit_compile=True)
        beams = decoding.compiled(model, "beam_candidates", width=4, alpha=0.6, max_length=length)
        beam = lambda s: beams(s)[0]  # noqa: E731  (the finished hypotheses)
        t_cached, ids_cached = _time(cached, src, repeats)
        t_uncached, ids_uncached = _time(uncached, src, repeats)
        t_beam, _ = _time(beam, src, repeats)
        tokens = batch * length
        common = {"batch": batch, "tokens_per_row": length}
        rows += [
            {
                **common,
                "decoder": "greedy, KV cache",
                "seconds": t_cached,
                "tokens_per_s": tokens / t_cached,
            },
            {
                **common,
                "decoder": "greedy, full recompute",
                "seconds": t_uncached,
                "tokens_per_s": tokens / t_uncached,
                "cached_speedup": t_uncached / t_cached,
                "identical": bool(np.array_equal(ids_cached, ids_uncached)),
            },
            {
                **common,
                "decoder": "beam 4, KV cache",
                "seconds": t_beam,
                "tokens_per_s": tokens / t_beam,
                "time_vs_greedy": t_beam / t_cached,
            },
        ]
    return rows


if __name__ == "__main__":
    import json

    for row in run("--quick" in sys.argv):
        print(json.dumps(row))
