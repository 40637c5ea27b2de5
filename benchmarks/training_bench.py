"""Figure 4 for `make bench`: training throughput, ours vs keras.layers.

    python -m benchmarks.training_bench [--quick]

The tagger's attention core is built twice from the same code: once with
`layers.TransformerEncoderBlock`, once with a KerasHub-style encoder block made
of `keras.layers.MultiHeadAttention`, `LayerNormalization` and `Dense` (same
sizes, same pre-LN wiring). Both train on the same random batches, plain and
with `jit_compile=True`, interleaved; tokens/s counts real (non-padding)
tokens. Seq2seq's training throughput is `benchmarks.throughput_bench`'s, its
decoding speed `benchmarks.decode_bench`'s.
"""

import contextlib
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


class KerasEncoderBlock(keras.layers.Layer):
    """What a user would write from keras.layers: pre-LN MHA + FFN."""

    def __init__(self, num_heads, intermediate_dim, dropout=0.1, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k in ("name", "dtype")}
        super().__init__(**kwargs)
        self.num_heads, self.intermediate_dim, self.rate = num_heads, intermediate_dim, dropout
        self.supports_masking = True

    def build(self, shape):
        d = shape[-1]
        self.attention = keras.layers.MultiHeadAttention(
            self.num_heads, d // self.num_heads, dropout=self.rate
        )
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.ffn1 = keras.layers.Dense(self.intermediate_dim, activation="gelu")
        self.ffn2 = keras.layers.Dense(d)
        self.drop = keras.layers.Dropout(self.rate)

    def call(self, x, mask=None, return_attention_scores=False, training=None):
        h = self.norm1(x)
        attn, scores = self.attention(
            h,
            h,
            attention_mask=None if mask is None else mask[:, None, :],
            return_attention_scores=True,
            training=training,
        )
        x = x + self.drop(attn, training=training)
        x = x + self.drop(self.ffn2(self.ffn1(self.norm2(x))), training=training)
        return (x, scores) if return_attention_scores else x


@contextlib.contextmanager
def keras_blocks():
    from zoo.tagger import archs as tagger_archs

    original = tagger_archs.TransformerEncoderBlock
    tagger_archs.TransformerEncoderBlock = KerasEncoderBlock
    try:
        yield
    finally:
        tagger_archs.TransformerEncoderBlock = original


def _tagger(jit):
    from zoo.tagger.model import Tagger

    words = ["<pad>", "<unk>"] + [f"w{i}" for i in range(2000)]
    chars = ["<pad>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz")
    tags = [f"T{i}" for i in range(17)]
    model = Tagger(words, chars, tags, arch="attention", rotary=False)
    core = model.core
    core.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=jit)
    return core


def _batches(core, batch, length, count, seed=0):
    rng = np.random.default_rng(seed)
    max_chars = (
        core.input["char_ids"].shape[-1]
        if isinstance(core.input, dict)
        else core.inputs[1].shape[-1]
    )
    out = []
    for _ in range(count):
        lengths = rng.integers(length // 2, length + 1, size=batch)
        ids = rng.integers(2, 2000, size=(batch, length)).astype("int32")
        ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
        chars = rng.integers(2, 28, size=(batch, length, max_chars)).astype("int32") * (
            ids[..., None] > 0
        )
        y = rng.integers(0, 17, size=(batch, length)).astype("int32")
        out.append(({"word_ids": ids, "char_ids": chars}, y, int(lengths.sum())))
    return out


def tagger_throughput(quick=False):
    batch, length = (16, 24) if quick else (32, 40)
    steps = 5 if quick else 20
    rows = []
    for jit in (False, True):
        cores = {"ours": _tagger(jit)}
        with keras_blocks():
            cores["keras.layers"] = _tagger(jit)
        data = _batches(cores["ours"], batch, length, steps)
        rates = {name: [] for name in cores}
        for name, core in cores.items():  # warm up (trace/compile) outside the timing
            core.train_on_batch(data[0][0], data[0][1])
        for _ in range(1 if quick else 3):
            for name, core in cores.items():
                start = time.perf_counter()
                for x, y, _ in data:
                    core.train_on_batch(x, y)
                rates[name].append(sum(n for _, _, n in data) / (time.perf_counter() - start))
        med = {name: float(np.median(r)) for name, r in rates.items()}
        rows.append(
            {
                "figure": "training",
                "model": "tagger (attention)",
                "jit_compile": jit,
                "ours_tokens_s": med["ours"],
                "keras_tokens_s": med["keras.layers"],
                "speedup": med["ours"] / med["keras.layers"],
            }
        )
    return rows


def run(quick=False):
    return tagger_throughput(quick)


if __name__ == "__main__":
    import json

    for row in run("--quick" in sys.argv):
        print(json.dumps(row))
