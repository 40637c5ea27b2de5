"""The hand-written attention backward equals autodiff of Keras's own layer.

`layers.softmax_attention` replaces the softmax's autodiff gradient; these
tests compare gradients of inputs and every weight against
`keras.layers.MultiHeadAttention` (weights copied over) and, where Keras has no
equivalent mask, against our own weights-returning path, which autodiff
differentiates.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import MultiHeadAttention, SelfAttention

RNG = np.random.default_rng(11)
KEYS = ("query", "key", "value", "output")
NAMES = ("query", "key", "value", "attention_output")


def _grads(call, layer, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = call(x)
        if isinstance(y, tuple):
            y = y[0]
        # A loss that weighs every output element differently, so no
        # symmetric error can cancel.
        weights = tf.cos(tf.reshape(tf.range(tf.size(y), dtype=y.dtype), tf.shape(y)))
        loss = tf.reduce_sum(tf.cast(y, "float32") * tf.cast(weights, "float32"))
    variables = {v.path.split("/")[-2] + "/" + v.name: v for v in layer.trainable_variables}
    grads = tape.gradient(loss, [x] + list(variables.values()))
    return np.asarray(y, "float32"), dict(zip(["x"] + list(variables), grads))


def _pair(**options):
    ours = MultiHeadAttention(num_heads=3, key_dim=4, **options)
    ref = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
    x = RNG.normal(size=(2, 9, 6)).astype("float32")
    ours(x)
    ref(x, x)
    for name in KEYS:
        getattr(ours, f"{name}_dense").set_weights(getattr(ref, f"_{name}_dense").get_weights())
    return ours, ref, x


def _assert_close(ours, ref, names_ours, names_ref, atol=1e-5):
    for a, b in zip(names_ours, names_ref):
        scale = max(1.0, float(np.max(np.abs(ref[b]))))
        diff = float(np.max(np.abs(np.asarray(ours[a]) - np.asarray(ref[b]))))
        assert diff <= atol * scale, (a, diff)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mask",
    [None, "padding", "causal"],
)
def test_gradients_equal_keras(mask):
    ours, ref, x = _pair(causal=mask == "causal")
    kwargs, ref_kwargs = {}, {}
    if mask == "padding":
        value_mask = np.array([[1] * 9, [1] * 4 + [0] * 5], bool)
        kwargs = ref_kwargs = dict(value_mask=value_mask)
    if mask == "causal":
        ref_kwargs = dict(use_causal_mask=True)
    y, g = _grads(lambda t: ours(t, **kwargs), ours, x)
    y_ref, g_ref = _grads(lambda t: ref(t, t, **ref_kwargs), ref, x)
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    # The key bias has no gradient in exact arithmetic (softmax ignores a
    # shift of a whole row); both layers give rounding noise there.
    names = ["x"] + [
        f"{n}/{w}" for n in NAMES for w in ("kernel", "bias") if n != "key" or w != "bias"
    ]
    assert set(names) <= set(g) and set(names) <= set(g_ref)
    _assert_close(g, g_ref, names, names)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [dict(window=2), dict(causal=True, include_self=False), dict(query_mask=True)],
)
def test_gradients_equal_autodiff_path_with_masks_keras_lacks(options):
    # `include_self=False` leaves the first query row with no key at all.
    options = dict(options)
    query_mask = options.pop("query_mask", False)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, **options)
    x = RNG.normal(size=(3, 8, 6)).astype("float32")
    kwargs = {}
    if query_mask:
        kwargs = dict(query_mask=np.array([[1] * 8, [1] * 3 + [0] * 5, [0] * 8], bool))
    layer(x)
    fast = _grads(lambda t: layer(t, **kwargs), layer, x)
    # return_attention_scores=True forces the autodiff path.
    slow = _grads(lambda t: layer(t, return_attention_scores=True, **kwargs), layer, x)
    np.testing.assert_allclose(fast[0], slow[0], atol=1e-6)
    assert set(fast[1]) == set(slow[1])
    _assert_close(fast[1], slow[1], list(slow[1]), list(slow[1]))


def test_single_head_layer_gradients_equal_autodiff_path():
    layer = SelfAttention(units=5, causal=True)
    x = RNG.normal(size=(2, 7, 6)).astype("float32")
    layer(x)
    fast = _grads(lambda t: layer(t), layer, x)
    slow = _grads(lambda t: layer(t, return_attention_scores=True), layer, x)
    _assert_close(fast[1], slow[1], list(slow[1]), list(slow[1]))


def test_mixed_precision_gradients_keep_dtypes_and_stay_finite():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = MultiHeadAttention(num_heads=2, key_dim=8)
        x = RNG.normal(size=(2, 6, 16)).astype("float16")
        layer(x)
        y, g = _grads(
            lambda t: layer(t, value_mask=np.array([[1] * 6, [1, 1, 0, 0, 0, 0]], bool)), layer, x
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert g["x"].dtype == tf.float16
    assert all(v.dtype == tf.float32 for k, v in g.items() if k != "x")
    assert all(np.all(np.isfinite(np.asarray(v, "float32"))) for v in g.values())
    assert float(np.max(np.abs(np.asarray(g["query/kernel"])))) > 0.0


@pytest.mark.slow
def test_xla_functions_keep_autodiff_and_agree():
    import layers.attention_ops as attention_ops

    seen = []

    @tf.function(jit_compile=True)
    def compiled(t):
        seen.append(attention_ops.compiled_by_xla())
        return t

    @tf.function
    def plain(t):
        seen.append(attention_ops.compiled_by_xla())
        return t

    compiled(tf.zeros(1))
    plain(tf.zeros(1))
    assert seen == [True, False] and not attention_ops.compiled_by_xla()
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = RNG.normal(size=(2, 5, 6)).astype("float32")
    layer(x)

    def grads(jit):
        @tf.function(jit_compile=jit)
        def step(t):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.sin(layer(t)))
            return tape.gradient(loss, layer.trainable_variables)

        return [np.asarray(g) for g in step(tf.constant(x))]

    for a, b in zip(grads(True), grads(False)):
        np.testing.assert_allclose(a, b, atol=1e-5)
