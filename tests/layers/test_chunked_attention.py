"""The memory-efficient (chunked, online-softmax) path equals the full path."""

import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.slow
@settings(max_examples=15)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(1, 23),
    chunk=st.integers(1, 9),
    structure=st.sampled_from(
        [
            dict(),
            dict(causal=True),
            dict(window=2),
            dict(causal=True, window=3, include_self=False),
            dict(normalize="relu"),
            dict(score="additive"),
        ]
    ),
    padded=st.booleans(),
)
def test_chunked_equals_full_values_and_gradients(seed, length, chunk, structure, padded):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, length, 8)).astype("float32")
    mask = None
    if padded:
        mask = np.ones((2, length), bool)
        mask[1, rng.integers(0, length + 1) :] = False
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
        y, cache = chunked(x[:, i : i + 1], cache=cache, cache_index=i)
        np.testing.assert_allclose(np.asarray(y), reference[:, i : i + 1], atol=1e-5)


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [dict(), dict(causal=True, window=2), dict(score="additive", normalize="relu")]
)
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(causal=True),
        dict(window=2, include_self=False),
        dict(rotary=True, causal=True),
        dict(causal=True, window=3),
        dict(normalize="relu"),
        dict(normalize="relu", causal=True, window=2),
    ],
)
def test_flash_backward_equals_full_autodiff(options):
    """The chunked path's hand-written (flash-attention-2) backward against
    autodiff of the full path, at 1e-5, with padded rows, one fully padded
    sequence and an explicit mask."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 13, 8)).astype("float32")
    mask = np.ones((3, 13), bool)
    mask[1, 9:] = False
    mask[2, :] = False
    attention_mask = rng.random((3, 13, 13)) > 0.2
    full, chunked = _pair(4, **options)
    _copy(full, chunked, x)
    kwargs = dict(query_mask=mask, attention_mask=attention_mask)
    y_full, g_full = _values_and_grads(full, x, **kwargs)
    y_chunk, g_chunk = _values_and_grads(chunked, x, **kwargs)
    np.testing.assert_allclose(y_chunk, y_full, atol=1e-5)
    assert np.all(y_chunk[2] == 0.0)
    for a, b in zip(g_chunk, g_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_flash_backward_cross_attention_with_cache_offset():
    """Cross-attention with a fully masked key set, and queries written at a
    cache offset (causal over absolute positions)."""
    rng = np.random.default_rng(6)
    q = rng.normal(size=(2, 6, 8)).astype("float32")
    source = rng.normal(size=(2, 11, 8)).astype("float32")
    value_mask = np.ones((2, 11), bool)
    value_mask[1] = False
    full, chunked = _pair(4)
    _copy(full, chunked, q, source)
    results = []
    for layer in (full, chunked):
        q_t, s_t = tf.constant(q), tf.constant(source)
        with tf.GradientTape() as tape:
            tape.watch([q_t, s_t])
            y = layer(q_t, s_t, value_mask=value_mask)
            loss = tf.reduce_sum(y * tf.cos(tf.range(8, dtype=y.dtype)))
        results.append(
            [y.numpy()]
            + [g.numpy() for g in tape.gradient(loss, [q_t, s_t] + layer.trainable_variables)]
        )
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Queries at an offset (a cache index: causal over absolute positions,
    # keys past the written length masked), on the function itself against
    # autodiff of the full path's softmax.
    from layers import attention_ops, flash_attention
    from layers.masks import Visibility

    q = tf.constant(rng.normal(size=(1, 4, 2, 4)).astype("float32"))
    k = tf.constant(rng.normal(size=(1, 11, 2, 4)).astype("float32"))
    v = tf.constant(rng.normal(size=(1, 11, 2, 4)).astype("float32"))
    visibility = Visibility(causal=True, query_offset=5, key_valid_length=9)
    outs = []
    for chunked in (False, True):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            if chunked:
                y, _ = flash_attention.flash_attention(q, k, v, chunk_size=3, visibility=visibility)
            else:
                mask = tf.expand_dims(visibility.structural(4, 11), 0)
                weighting = attention_ops.Weighting(score="dot", normalize="softmax")
                y, _ = attention_ops.attention_context(q, k, v, mask, weighting, need_weights=True)
            loss = tf.reduce_sum(y * tf.sin(tf.range(4, dtype=y.dtype)))
        outs.append([y.numpy()] + [g.numpy() for g in tape.gradient(loss, [q, k, v])])
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.all(outs[1][2][:, 9:] == 0.0)  # unwritten keys get no gradient


@pytest.mark.slow
def test_flash_path_mixed_precision():
    import keras

    x = np.random.default_rng(7).normal(size=(2, 10, 8)).astype("float32")
    full, chunked = _pair(4, causal=True)
    _copy(full, chunked, x)
    reference = np.asarray(full(x))
    keras.config.set_dtype_policy("mixed_bfloat16")
    low = MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=4, causal=True)
    low(x)
    low.set_weights(full.get_weights())
    x_t = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_t)
        y = low(x_t)
        loss = tf.reduce_sum(tf.cast(y, "float32") ** 2)
    grad = tape.gradient(loss, x_t)
    assert y.dtype == tf.bfloat16 and grad.dtype == tf.float32
    assert np.all(np.isfinite(grad.numpy()))
    np.testing.assert_allclose(np.asarray(y, "float32"), reference, atol=5e-2)


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "big", "AUTO", [4]])
def test_chunk_size_refuses_bad_values(bad):
    from layers import SelfAttention, TransformerEncoderBlock

    for make in (
        lambda: MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=bad),
        lambda: SelfAttention(units=4, chunk_size=bad),
        lambda: TransformerEncoderBlock(num_heads=2, intermediate_dim=8, chunk_size=bad),
    ):
        with pytest.raises(
            ValueError, match=r"chunk_size.*Received: chunk_size=" + re.escape(repr(bad))
        ):
            make()


def test_chunk_size_auto_decides_from_the_shapes():
    from layers import chunked_attention

    resolve = chunked_attention.resolve_chunk_size
    assert resolve("auto", 1, 8, 1024, 1024) is None
    assert resolve("auto", 1, 8, 4096, 4096) == chunked_attention.AUTO_CHUNK_SIZE
    assert resolve("auto", 1, 8, 65536, 65536) == chunked_attention.AUTO_CHUNK_SIZE
    assert (
        resolve("auto", 64, 8, 1024, 1024) == chunked_attention.AUTO_CHUNK_SIZE
    )  # 2 GiB of scores
    assert resolve("auto", 1, 8, 1, 65536) is None  # one decoding step
    assert resolve("auto", None, 8, None, None) is None  # dynamic length: full path
    assert resolve(7, 1, 8, 10, 10) == 7 and resolve(None, 1, 8, 10**6, 10**6) is None


def test_chunk_size_auto_switches_paths(monkeypatch):
    """ "auto" runs the full path below the threshold and the chunked one
    above it (threshold lowered), with the same result and gradients."""
    from layers import SelfAttention, chunked_attention, flash_attention

    calls = []
    original = flash_attention.flash_attention

    def counted(*args, **kwargs):
        calls.append(kwargs["chunk_size"])
        return original(*args, **kwargs)

    monkeypatch.setattr(flash_attention, "flash_attention", counted)
    x = np.random.default_rng(8).normal(size=(2, 12, 8)).astype("float32")
    mask = np.ones((2, 12), bool)
    mask[0, 8:] = False
    full, auto = _pair("auto", causal=True)
    _copy(full, auto, x)
    assert calls == []  # small: full path
    y_full, g_full = _values_and_grads(full, x, query_mask=mask)
    monkeypatch.setattr(chunked_attention, "AUTO_MIN_ENTRIES", 100)
    monkeypatch.setattr(chunked_attention, "AUTO_CHUNK_SIZE", 5)
    y_auto, g_auto = _values_and_grads(auto, x, query_mask=mask)
    assert calls and set(calls) == {5}
    np.testing.assert_allclose(y_auto, y_full, atol=1e-5)
    for a, b in zip(g_auto, g_full):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Scores asked for: "auto" gives them from the full path.
    _, scores = auto(x, return_attention_scores=True)
    assert tuple(scores.shape) == (2, 2, 12, 12)
    sa = SelfAttention(units=4, chunk_size="auto")
    calls.clear()
    sa(x)
    assert calls == [5]
    restored = MultiHeadAttention.from_config(auto.get_config())
    assert restored.chunk_size == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("length", [12, 13])
def test_flash_backward_without_any_mask(length):
    """No mask at all: at 12 (a multiple of the block) the blocks skip the
    mask arithmetic; at 13 the padding mask is back."""
    x = np.random.default_rng(9).normal(size=(2, length, 8)).astype("float32")
    full, chunked = _pair(4)
    _copy(full, chunked, x)
    y_full, g_full = _values_and_grads(full, x)
    y_chunk, g_chunk = _values_and_grads(chunked, x)
    np.testing.assert_allclose(y_chunk, y_full, atol=1e-5)
    for a, b in zip(g_chunk, g_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_flash_backward_in_compiled_function_with_dynamic_length(jit):
    """The custom gradient traced once for any length (None dims), with and
    without XLA, against the full path's gradients."""
    full, chunked = _pair(5, causal=True)
    x = np.random.default_rng(10).normal(size=(2, 12, 8)).astype("float32")
    _copy(full, chunked, x)

    def gradient_fn(layer):
        @tf.function(input_signature=[tf.TensorSpec((None, None, 8), tf.float32)], jit_compile=jit)
        def fn(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = layer(t)
                loss = tf.reduce_sum(y * tf.sin(tf.range(8, dtype=y.dtype)))
            return tape.gradient(loss, [t] + layer.trainable_variables)

        return fn

    full_fn, chunked_fn = gradient_fn(full), gradient_fn(chunked)
    for length in (12, 7):
        for a, b in zip(chunked_fn(x[:, :length]), full_fn(x[:, :length])):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
