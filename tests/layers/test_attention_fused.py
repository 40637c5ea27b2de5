"""The fused path (`keras.ops.dot_product_attention`) equals the reference
path, outputs and gradients, under TensorFlow (in process) and JAX (a
subprocess with KERAS_BACKEND=jax; `python -m tests.layers.test_attention_fused`).

`attention_ops.forced_fused` forces the path either way: the default picks the
fused kernel only on JAX with a GPU/TPU, which these CPU tests do not have.
Each comparison also counts the calls of `keras.ops.dot_product_attention`,
so a fused run that silently took the other path fails. Under JAX a local
window is the kernel's own (`jax.nn.dot_product_attention(local_window_size=
...)`, XLA's form here on CPU): the calls and the windows they pass are
counted too, so a window that should stay in the mask (cross-attention,
`include_self=False`) or should not (self-attention) fails where it goes.
"""

import keras
import numpy as np
import pytest
from keras import ops

from layers import MultiHeadAttention, SelfAttention, TransformerEncoderBlock, attention_ops
from tests.support.backends import run_under_jax

B, T, S, D = 2, 9, 7, 8


def values_and_grads(layer, inputs, **kwargs):
    """Output and d(sum(y * w))/d(weights, inputs) on the current backend."""
    inputs = [np.asarray(t, "float32") for t in inputs]
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        params = [v.value for v in layer.trainable_variables]

        def loss(params, inputs):
            y, _ = layer.stateless_call(params, [], *inputs, **kwargs)
            w = jnp.sin(jnp.arange(y.size, dtype="float32")).reshape(y.shape)
            return jnp.sum(y.astype("float32") * w), y

        (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, inputs)
        return np.asarray(y, "float32"), [
            np.asarray(g, "float32") for g in jax.tree_util.tree_leaves(grads)
        ]
    import tensorflow as tf

    tensors = [tf.constant(t) for t in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y = layer(*tensors, **kwargs)
        w = tf.reshape(tf.sin(tf.range(tf.size(y), dtype="float32")), tf.shape(y))
        loss = tf.reduce_sum(tf.cast(y, "float32") * w)
    grads = tape.gradient(loss, layer.trainable_variables + tensors)
    return np.asarray(y, "float32"), [np.asarray(g, "float32") for g in grads]


class _CountFused:
    """Counts fused-kernel calls while active: `keras.ops.dot_product_attention`,
    and under JAX the direct `jax.nn.dot_product_attention` calls that pass
    `local_window_size` (the local-window route), whose windows it records."""

    def __enter__(self):
        self.calls = 0
        self.windows = []
        self._original = ops.dot_product_attention

        def counted(*args, **kwargs):
            self.calls += 1
            return self._original(*args, **kwargs)

        ops.dot_product_attention = counted
        self._jax_original = None
        if keras.backend.backend() == "jax":
            import jax

            self._jax_original = jax.nn.dot_product_attention

            def counted_jax(*args, **kwargs):
                if kwargs.get("local_window_size") is not None:
                    self.calls += 1
                    self.windows.append(tuple(kwargs["local_window_size"]))
                return self._jax_original(*args, **kwargs)

            jax.nn.dot_product_attention = counted_jax
        return self

    def __exit__(self, *exc):
        ops.dot_product_attention = self._original
        if self._jax_original is not None:
            import jax

            jax.nn.dot_product_attention = self._jax_original


def run_both(make_layer, inputs, window=None, **kwargs):
    """The layer's output and gradients on the reference path and on the
    fused path (same weights); asserts the fused kernel ran only on the
    second, and that under JAX it took the local-window route exactly when
    `window` (the `local_window_size` it must pass) is given; elsewhere
    windows stay in the explicit mask."""
    results = []
    weights = None
    want_windows = {window} if window is not None and keras.backend.backend() == "jax" else set()
    for fused in (False, True):
        with attention_ops.forced_fused(fused):
            layer = make_layer()
            with _CountFused() as count:
                layer(*inputs, **kwargs)  # builds
                if weights is None:
                    weights = layer.get_weights()
                layer.set_weights(weights)
                results.append(values_and_grads(layer, inputs, **kwargs))
            assert (count.calls > 0) == fused, (fused, count.calls)
            assert set(count.windows) == (want_windows if fused else set()), count.windows
    assert attention_ops._FORCED.get() is None  # the override ended with its block
    return results


def _masks(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D)).astype("float32")
    source = rng.normal(size=(B, S, D)).astype("float32")
    query_mask = np.ones((B, T), bool)
    query_mask[1, 6:] = False
    value_mask = np.ones((B, S), bool)
    value_mask[0, 4:] = False
    attention_mask = rng.random((B, T, S)) > 0.3
    attention_mask[0, 2] = False  # a query row with nothing to attend to
    return x, source, query_mask, value_mask, attention_mask


def _self_masks(seed=0):
    """Self-attention's own key mask and explicit mask ([B, T] and [B, T, T]):
    in batch 0 the keys 3-5 are masked, so query 4 has no key within a
    window of 1 (it must come out zero) though it has keys outside it."""
    rng = np.random.default_rng(seed + 100)
    value_mask = np.ones((B, T), bool)
    value_mask[0, 3:6] = False
    attention_mask = rng.random((B, T, T)) > 0.3
    attention_mask[:, np.arange(T), np.arange(T)] = True
    attention_mask[1, 5] = False  # a query row with nothing to attend to
    return value_mask, attention_mask


def _mha(**options):
    return lambda: MultiHeadAttention(num_heads=2, key_dim=4, **options)


CASES = {
    "plain": (_mha(), "self", {}),
    "causal": (_mha(causal=True), "self", {}),  # the kernel's own causal mask
    "causal_padded": (_mha(causal=True), "self", {"query_mask": True}),
    "window_no_self": (_mha(window=2, include_self=False), "self", {"query_mask": True}),
    "rotary_causal": (_mha(rotary=True, causal=True), "self", {}),
    "cross_masked": (_mha(), "cross", {"value_mask": True, "attention_mask": True}),
    "dot_score": (_mha(score="dot"), "self", {}),
    # Local windows: under JAX the kernel's own window (`local_window_size`).
    "window": (_mha(window=2), "self", {}),
    "window_zero": (_mha(window=0), "self", {}),
    "window_padded": (_mha(window=2), "self", {"query_mask": True}),
    "window_causal": (_mha(window=2, causal=True), "self", {}),
    "window_causal_padded": (_mha(window=3, causal=True), "self", {"query_mask": True}),
    "window_empty_rows": (_mha(window=1), "self", {"value_mask": "self_value_mask"}),
    "window_causal_masked": (
        _mha(window=2, causal=True),
        "self",
        {"query_mask": True, "attention_mask": "self_attention_mask"},
    ),
    "window_rotary_dot": (_mha(window=2, rotary=True, score="dot"), "self", {}),
    # Windows that keep the explicit mask: cross-attention's positions differ.
    "window_cross": (_mha(window=2), "cross", {"value_mask": True}),
}

# The `local_window_size` each case passes under JAX (absent: none).
JAX_WINDOWS = {
    "window": (2, 2),
    "window_zero": (0, 0),
    "window_padded": (2, 2),
    "window_causal": (2, 0),
    "window_causal_padded": (3, 0),
    "window_empty_rows": (1, 1),
    "window_causal_masked": (2, 0),
    "window_rotary_dot": (2, 2),
}


def check_case(name):
    make, kind, wanted = CASES[name]
    x, source, query_mask, value_mask, attention_mask = _masks()
    inputs = [x] if kind == "self" else [x, source]
    self_value_mask, self_attention_mask = _self_masks()
    available = {
        "query_mask": query_mask,
        "value_mask": value_mask,
        "attention_mask": attention_mask,
        "self_value_mask": self_value_mask,
        "self_attention_mask": self_attention_mask,
    }
    kwargs = {k: available[k if source is True else source] for k, source in wanted.items()}
    (y_ref, g_ref), (y_fused, g_fused) = run_both(
        make, inputs, window=JAX_WINDOWS.get(name), **kwargs
    )
    np.testing.assert_allclose(y_fused, y_ref, atol=1e-5, err_msg=name)
    assert len(g_fused) == len(g_ref)
    for a, b in zip(g_fused, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
    if "query_mask" in wanted:
        assert np.all(y_fused[1, 6:] == 0.0), name
    if name == "window_empty_rows":
        assert np.all(y_fused[0, 4] == 0.0) and np.all(y_ref[0, 4] == 0.0), name


def check_self_attention():
    x, _, mask, _, _ = _masks(1)
    _, attention_mask = _self_masks(1)
    cases = (
        (dict(), {}, None),
        (dict(window=1, causal=True), {}, (1, 0)),
        (dict(window=2), {"attention_mask": attention_mask}, (2, 2)),
        (dict(window=2, include_self=False), {}, None),  # not JAX's window: the mask
    )
    for options, extra, window in cases:
        (y_ref, g_ref), (y_fused, g_fused) = run_both(
            lambda: SelfAttention(units=4, **options), [x], window=window, mask=mask, **extra
        )
        np.testing.assert_allclose(y_fused, y_ref, atol=1e-5)
        for a, b in zip(g_fused, g_ref):
            np.testing.assert_allclose(a, b, atol=1e-5)
        assert np.all(y_fused[1, 6:] == 0.0)


def check_encoder_block():
    x, _, mask, _, _ = _masks(2)
    for options, window in ((dict(), None), (dict(window=2), (2, 0))):
        (y_ref, g_ref), (y_fused, g_fused) = run_both(
            lambda: TransformerEncoderBlock(
                num_heads=2, intermediate_dim=16, dropout=0.0, causal=True, **options
            ),
            [x],
            window=window,
            mask=mask,
        )
        np.testing.assert_allclose(y_fused, y_ref, atol=1e-5)
        for a, b in zip(g_fused, g_ref):
            np.testing.assert_allclose(a, b, atol=1e-5)


def check_options_that_keep_their_path():
    """Returned scores, additive scores, ReLU weights and active dropout
    never take the fused kernel, even when it is forced on."""
    x = _masks()[0]
    with attention_ops.forced_fused(True):
        with _CountFused() as count:
            MultiHeadAttention(num_heads=2, key_dim=4)(x, return_attention_scores=True)
            MultiHeadAttention(num_heads=2, key_dim=4, score="additive")(x)
            MultiHeadAttention(num_heads=2, key_dim=4, normalize="relu")(x)
            MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)(x, training=True)
            windowed = MultiHeadAttention(num_heads=2, key_dim=4, window=2, causal=True)
            windowed(x, return_attention_scores=True)
            MultiHeadAttention(num_heads=2, key_dim=4, window=2, normalize="relu")(x)
            SelfAttention(units=4, window=1, dropout=0.5)(x, training=True)
        assert count.calls == 0
        with _CountFused() as count:
            MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)(x, training=False)
        assert count.calls == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_equals_reference_tensorflow(name):
    check_case(name)


def test_fused_self_attention_and_encoder_block_tensorflow():
    check_self_attention()
    check_encoder_block()


def test_options_that_keep_their_path():
    check_options_that_keep_their_path()


def test_default_policy_keeps_tensorflow_cpu_path():
    # TF-CPU ratios in benchmarks/results.md come from the hand-written
    # backward; the default must not switch them to the fused kernel.
    assert keras.backend.backend() == "tensorflow"
    assert not attention_ops.fused_enabled()
    x = _masks()[0]
    with _CountFused() as count:
        MultiHeadAttention(num_heads=2, key_dim=4, causal=True)(x)
    assert count.calls == 0


@pytest.mark.slow
def test_fused_equals_reference_jax():
    stdout = run_under_jax("tests.layers.test_attention_fused", timeout=900)
    assert "jax: fused checks passed" in stdout, stdout


def main():
    assert keras.backend.backend() == "jax"
    import jax

    # On JAX's CPU backend the default keeps the einsum path (measured faster).
    assert attention_ops.fused_enabled() == (jax.default_backend() != "cpu")
    for name in sorted(CASES):
        check_case(name)
        print("PASS", name, flush=True)
    check_self_attention()
    check_encoder_block()
    check_options_that_keep_their_path()
    print("jax: fused checks passed")


if __name__ == "__main__":
    main()


@pytest.mark.slow
def test_gpu_benchmark_child_runs_without_tensorflow():
    """benchmarks/attention_gpu.py's child at a tiny shape, under JAX with
    `import tensorflow` made impossible (the device machine has none):
    the agreement check passes and the row is timed."""
    import json

    config = dict(
        kind="long", impl="chunked", length=24, dim=16, chunk=8, dtype="float32", smoke=True
    )
    stdout = run_under_jax(
        "benchmarks.attention_gpu", "--child", json.dumps(config), without_tensorflow=True
    )
    row = json.loads(stdout.strip().splitlines()[-1])
    assert "error" not in row, row
    assert row["max_rel_error"] <= row["tolerance"] and row["fwdbwd_ms"] > 0, row
