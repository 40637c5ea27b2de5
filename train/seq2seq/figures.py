"""attention.png: where the decoder looked in the source for each word it wrote."""

import contextlib

import matplotlib
import numpy as np
from keras import ops

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from zoo import atomic  # noqa: E402
from zoo.seq2seq import decoding  # noqa: E402
from zoo.seq2seq.tokenization import BOS_ID, EOS_ID  # noqa: E402


@contextlib.contextmanager
def _recording(block):
    """Stands in for `block`'s cross-attention layer and keeps the weights of each call."""
    layer, scores = block.cross_attention_layer, []

    def record(*args, **kwargs):
        out, weights = layer(*args, return_attention_scores=True, **kwargs)
        scores.append(weights)
        return out

    # object.__setattr__ keeps Keras's layer tracking out of it: the model is only read.
    object.__setattr__(block, "cross_attention_layer", record)
    try:
        yield scores
    finally:
        object.__setattr__(block, "cross_attention_layer", layer)


def cross_attention(model, text):
    """(source pieces, output pieces, weights `[heads, outputs, sources]`) of the last
    decoder block (its last step for the Universal Transformer) translating `text`
    greedily: row i is where the decoder looked when it wrote output piece i."""
    tokenizer = model.tokenizer
    source = tokenizer.encode([text])
    out = list(decoding.decode_ids(model, source)[0]) or [EOS_ID]
    encoded, mask = model.encode(np.asarray(source, "int32"))
    with _recording(model.decoder_blocks[-1]) as scores:
        model.decode(np.asarray([[BOS_ID] + out[:-1]], "int32"), encoded, mask)
    weights = ops.convert_to_numpy(ops.cast(scores[-1], "float32"))[0]
    pieces = tokenizer.pieces()

    def words(ids):
        # SentencePiece marks a word's start with U+2581; the plot shows words bare.
        return [pieces[i].replace("\u2581", "") if i != EOS_ID else "</s>" for i in ids]

    return words(source[0]), words(out), weights


def plot_cross_attention(model, text, path):
    """Heatmap of the heads' mean cross-attention: one row an output piece, one column a
    source piece. Written atomically to `path`."""
    source, output, weights = cross_attention(model, text)
    mean = weights.mean(axis=0)
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.38 * len(source) + 1.6), max(3.0, 0.3 * len(output) + 1.2))
    )
    ax.imshow(mean, cmap="viridis", vmin=0.0, aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=90, fontsize=8)
    ax.set_yticks(range(len(output)), output, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output (greedy)")
    ax.set_title("Cross-attention of the last decoder block, mean of the heads", fontsize=9)
    fig.tight_layout()
    with atomic.building(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
