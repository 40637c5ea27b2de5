"""The memory-efficient (chunked, online-softmax) path equals the full path."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from layers import MultiHeadAttention


def _pair(chunk_size, **options):
    full = MultiHeadAttention(num_heads=2, key_dim=4, **options)
    chunked = MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=chunk_size, **options)
    return full, chunked


def _copy(full, chunked, x, source=None):
    args = (x,) if source is None else (x, source)
    full(*args)
    chunked(*args)
    chunked.set_weights(full.get_weights())


def _values_and_grads(layer, x, **kwargs):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, **kwargs)
        loss = tf.reduce_sum(y * tf.sin(tf.range(tf.size(y), dtype=y.dtype)[: y.shape[-1]]))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return y.numpy(), [g.numpy() for g in grads]


@settings(max_examples=15)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(1, 23),
    chunk=st.integers(1, 9),
    structure=st.sampled_from(
        [dict(), dict(causal=True), dict(window=2), dict(causal=True, window=3, include_self=False),
         dict(normalize="relu"), dict(score="additive")]
    ),
    padded=st.booleans(),
)
def test_chunked_equals_full_values_and_gradients(seed, length, chunk, structure, padded):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, length, 8)).astype("float32")
    mask = None
    if padded:
        mask = np.ones((2, length), bool)
        mask[1, rng.integers(0, length + 1):] = False
    full, chunked = _pair(chunk, **structure)
    _copy(full, chunked, x)
    y_full, g_full = _values_and_grads(full, x, query_mask=mask)
    y_chunk, g_chunk = _values_and_grads(chunked, x, query_mask=mask)
    np.testing.assert_allclose(y_chunk, y_full, atol=1e-5)
    for a, b in zip(g_chunk, g_full):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("chunk", [3, 4])
def test_chunked_cross_attention_with_masks(chunk):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 7, 8)).astype("float32")
    source = rng.normal(size=(2, 10, 8)).astype("float32")
    value_mask = np.ones((2, 10), bool)
    value_mask[0, 6:] = False
    value_mask[1, :] = False  # nothing to attend to: zero rows on both paths
    attention_mask = rng.random((2, 7, 10)) > 0.3
    full, chunked = _pair(chunk)
    _copy(full, chunked, q, source)
    kwargs = dict(value_mask=value_mask, attention_mask=attention_mask)
    y_full = np.asarray(full(q, source, **kwargs))
    y_chunk = np.asarray(chunked(q, source, **kwargs))
    np.testing.assert_allclose(y_chunk, y_full, atol=1e-5)
    assert np.all(y_chunk[1] == 0.0)


def test_chunked_cache_decoding_equals_full():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 11, 8)).astype("float32")
    full, chunked = _pair(4, causal=True)
    _copy(full, chunked, x)
    reference = np.asarray(full(x))
    cache = np.zeros((1, 2, 11, 2, 4), "float32")
    for i in range(11):
        y, cache = chunked(x[:, i:i + 1], cache=cache, cache_index=i)
        np.testing.assert_allclose(np.asarray(y), reference[:, i:i + 1], atol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_in_compiled_function_with_dynamic_length(jit):
    full, chunked = _pair(5, causal=True)
    x = np.random.default_rng(3).normal(size=(2, 12, 8)).astype("float32")
    _copy(full, chunked, x)
    fn = tf.function(
        lambda t: chunked(t),
        input_signature=[tf.TensorSpec((None, None, 8), tf.float32)],
        jit_compile=jit,
    )
    for length in (12, 7):
        np.testing.assert_allclose(
            fn(x[:, :length]).numpy(), np.asarray(full(x[:, :length])), atol=1e-5
        )


def test_chunked_refuses_to_return_scores():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=4)
    with pytest.raises(ValueError, match="chunk_size=4"):
        layer(np.zeros((1, 5, 8), "float32"), return_attention_scores=True)
    with pytest.raises(ValueError, match="chunk_size=0"):
        MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=0)


@pytest.mark.parametrize("options", [dict(), dict(causal=True, window=2), dict(score="additive", normalize="relu")])
def test_self_attention_chunked_equals_full(options):
    from layers import SelfAttention

    x = np.random.default_rng(4).normal(size=(2, 10, 6)).astype("float32")
    mask = np.ones((2, 10), bool)
    mask[0, 7:] = False
    full = SelfAttention(units=4, **options)
    chunked = SelfAttention(units=4, chunk_size=3, **options)
    full(x)
    chunked(x)
    chunked.set_weights(full.get_weights())
    y_full, g_full = _values_and_grads(full, x, mask=mask)
    y_chunk, g_chunk = _values_and_grads(chunked, x, mask=mask)
    np.testing.assert_allclose(y_chunk, y_full, atol=1e-5)
    for a, b in zip(g_chunk, g_full):
        np.testing.assert_allclose(a, b, atol=1e-4)
