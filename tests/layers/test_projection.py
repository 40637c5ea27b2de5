"""The projection layouts against NumPy formulas: values and every gradient."""

import numpy as np
import pytest
import tensorflow as tf

from layers.projection import flat_matmul, heads_first_projection

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

RNG = np.random.default_rng(5)


def _loss_weights(shape):
    return RNG.normal(size=shape).astype("float32")


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dynamic", [False, True])
def test_heads_first_projection_values_and_gradients_equal_numpy(with_bias, dynamic):
    batch, steps, channels, depth = 2, 5, 6, 3
    x = RNG.normal(size=(batch, steps, channels)).astype("float32")
    # Different head counts per kernel, as a cross-check of the split.
    kernels = [RNG.normal(size=(channels, h, depth)).astype("float32") for h in (2, 3, 1)]
    biases = [RNG.normal(size=(h, depth)).astype("float32") for h in (2, 3, 1)]
    seeds = [_loss_weights((h, batch, steps, depth)) for h in (2, 3, 1)]

    signature = [tf.TensorSpec((None, None, channels) if dynamic else x.shape, tf.float32)]

    @tf.function(input_signature=signature)
    def run(t):
        ks = [tf.constant(k) for k in kernels]
        bs = [tf.constant(b) for b in biases] if with_bias else None
        with tf.GradientTape() as tape:
            tape.watch([t] + ks + (bs or []))
            outs = heads_first_projection(t, ks, bs)
            loss = sum(tf.reduce_sum(o * s) for o, s in zip(outs, seeds))
        return outs, tape.gradient(loss, [t] + ks + (bs or []))

    outs, grads = run(tf.constant(x))
    for out, k, b in zip(outs, kernels, biases):
        expected = np.einsum("btc,chd->hbtd", x, k) + (b[:, None, None, :] if with_bias else 0)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    d_x = sum(np.einsum("hbtd,chd->btc", s, k) for s, k in zip(seeds, kernels))
    np.testing.assert_allclose(grads[0], d_x, rtol=1e-5, atol=1e-5)
    for s, g in zip(seeds, grads[1:4]):
        np.testing.assert_allclose(g, np.einsum("btc,hbtd->chd", x, s), rtol=1e-5, atol=1e-5)
    if with_bias:
        for s, g in zip(seeds, grads[4:]):
            np.testing.assert_allclose(g, s.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_rank", [1, 2])
def test_flat_matmul_values_and_gradients_equal_numpy(in_rank):
    in_dims = (6,) if in_rank == 1 else (3, 5)
    x = RNG.normal(size=(2, 4) + in_dims).astype("float32")
    kernel = RNG.normal(size=in_dims + (2, 3)).astype("float32")
    bias = RNG.normal(size=(2, 3)).astype("float32")
    seed = _loss_weights((2, 4, 2, 3))
    t, k, b = tf.constant(x), tf.constant(kernel), tf.constant(bias)
    with tf.GradientTape() as tape:
        tape.watch([t, k, b])
        out = flat_matmul(t, k, b, in_rank)
        loss = tf.reduce_sum(out * seed)
    grads = tape.gradient(loss, [t, k, b])
    letters = "pq"[:in_rank]
    np.testing.assert_allclose(
        out, np.einsum(f"bt{letters},{letters}hk->bthk", x, kernel) + bias, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        grads[0], np.einsum(f"bthk,{letters}hk->bt{letters}", seed, kernel), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        grads[1], np.einsum(f"bt{letters},bthk->{letters}hk", x, seed), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(grads[2], seed.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
