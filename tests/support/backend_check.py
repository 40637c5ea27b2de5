"""Runs under any Keras backend (a subprocess of test_backends.py sets
KERAS_BACKEND): the attention layers against the NumPy reference, Keras's own
layer, their cache and chunked paths, gradients through the chunked path, and SAGAN's
attention probe (zoo.sagan.model.attention_scores).
Prints one line per check and exits non-zero on the first failure."""

import sys

import keras
import numpy as np
from keras import ops

from layers import MultiHeadAttention, SelfAttention, TransformerDecoderBlock
from tests.support.attention_reference import allowed_matrix, single_head


def check(name, ok):
    print(("PASS " if ok else "FAIL ") + name, flush=True)
    if not ok:
        sys.exit(1)


def main():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 9, 8)).astype("float32")

    layer = SelfAttention(units=4, window=2, score="additive")
    out, alpha = layer(x, return_attention_scores=True)
    wq, wk, wv = (
        np.asarray(d.kernel) for d in (layer.query_dense, layer.key_dense, layer.value_dense)
    )
    ref, ref_alpha = single_head(
        x[0],
        wq,
        wk,
        wv,
        score="additive",
        w=np.asarray(layer.score_vector),
        allowed=allowed_matrix(9, 9, window=2),
    )
    check("SelfAttention == NumPy", np.allclose(np.asarray(out[0]), ref, atol=1e-5))

    ours = MultiHeadAttention(num_heads=2, key_dim=4, causal=True)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    ours(x)
    theirs(x, x)
    for name in ("query", "key", "value", "output"):
        getattr(ours, f"{name}_dense").set_weights(getattr(theirs, f"_{name}_dense").get_weights())
    full = np.asarray(ours(x))
    check(
        "MultiHeadAttention == keras.layers.MultiHeadAttention",
        np.allclose(full, np.asarray(theirs(x, x, use_causal_mask=True)), atol=1e-5),
    )

    cache = ops.zeros((2, 2, 9, 2, 4))
    steps = []
    for i in range(9):
        y, cache = ours(x[:, i : i + 1], cache=cache, cache_index=i)
        steps.append(np.asarray(y))
    check("KV cache == full", np.allclose(np.concatenate(steps, 1), full, atol=1e-5))

    chunked = MultiHeadAttention(num_heads=2, key_dim=4, causal=True, chunk_size=4)
    chunked(x)
    chunked.set_weights(ours.get_weights())
    check("chunked == full", np.allclose(np.asarray(chunked(x)), full, atol=1e-5))

    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0)
    enc = rng.normal(size=(2, 5, 8)).astype("float32")
    full_block = np.asarray(block(x, enc))
    cache = ops.zeros((2, 2, 9, 2, 4))
    cross = block.compute_cross_attention_cache(enc)
    step, cache = block(
        x[:, :1], self_attention_cache=cache, cache_index=0, cross_attention_cache=cross
    )
    check("decoder cache == full", np.allclose(np.asarray(step), full_block[:, :1], atol=1e-5))

    if keras.backend.backend() == "jax":
        import jax

        def loss(inputs, layer):
            return ops.sum(layer(inputs) ** 2)

        g_full = jax.grad(loss)(x, ours)
        g_chunk = jax.grad(loss)(x, chunked)
        print(
            "max |grad diff|",
            float(np.max(np.abs(g_chunk - g_full))),
            "max |grad|",
            float(np.max(np.abs(g_full))),
        )
        check("chunked gradients == full (jax.grad)", np.allclose(g_chunk, g_full, atol=1e-5))

        # The flash-attention-2 backward with padded rows, a fully padded
        # sequence, a window and rotary, against jax.grad of the full path.
        mask = np.ones((2, 9), bool)
        mask[0, 6:] = False
        mask[1] = False
        pair = [
            MultiHeadAttention(num_heads=2, key_dim=4, window=3, rotary=True, chunk_size=size)
            for size in (None, 4)
        ]
        for layer in pair:
            layer(x)
        pair[1].set_weights(pair[0].get_weights())

        def loss_masked(params, inputs, layer):
            y, _ = layer.stateless_call(params, [], inputs, query_mask=mask)
            return ops.sum(y * ops.sin(ops.arange(8, dtype="float32")))

        grads = [
            jax.grad(loss_masked, argnums=(0, 1))(
                [v.value for v in layer.trainable_variables], x, layer
            )
            for layer in pair
        ]
        flat = [jax.tree_util.tree_leaves(g) for g in grads]
        check(
            "chunked masked/window/rotary gradients == full (jax.grad)",
            all(np.allclose(a, b, atol=1e-5) for a, b in zip(*flat)),
        )
    # SAGAN's end-of-run attention figure reads the scores through one probe model
    # (jitted under JAX); the reference is the layer called eagerly on its input.
    from zoo.sagan.model import ATTENTION_LAYER, attention_scores, build_generator

    g = build_generator(image_size=32, num_classes=4, width=8, latent_dim=16, seed=0)
    feed = {
        "noise": rng.normal(size=(3, 16)).astype("float32"),
        "label": np.arange(3, dtype="int32"),
    }
    images, scores, side = attention_scores(g, feed)
    layer = g.get_layer(ATTENTION_LAYER)
    features = keras.Model(g.input, layer.input)(feed, training=False)
    _, ref_scores = layer(features, return_attention_scores=True, training=False)
    check(
        "SAGAN attention_scores == the layer's own, images == G's",
        side == 16
        and np.allclose(np.asarray(scores), np.asarray(ref_scores), atol=1e-6)
        and np.allclose(np.asarray(images), np.asarray(g(feed, training=False)), atol=1e-6),
    )
    print(f"backend {keras.backend.backend()}: all checks passed")


if __name__ == "__main__":
    main()
