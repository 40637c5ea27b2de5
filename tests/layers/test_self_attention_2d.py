"""SelfAttention2D: the SAGAN block vs a NumPy reference, identity at gamma=0, layer contract."""

import keras
import numpy as np
import pytest

from layers import SelfAttention2D
from tests.support.harness import run_layer_test, tflite_convert_and_run

RNG = np.random.default_rng(5)


def _numpy_sagan(x, wq, wk, wv, wo, gamma, pool):
    """The paper's block written out in NumPy with already-normalised kernels."""
    b, h, w, c = x.shape
    conv = lambda t, k: t @ k.reshape(k.shape[-2], k.shape[-1])  # 1x1 conv
    q, k, v = conv(x, wq), conv(x, wk), conv(x, wv)
    if pool:
        k = k.reshape(b, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4))
        v = v.reshape(b, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4))
    q, k, v = (t.reshape(b, -1, t.shape[-1]) for t in (q, k, v))
    logits = q @ k.transpose(0, 2, 1)
    beta = np.exp(logits - logits.max(-1, keepdims=True))
    beta /= beta.sum(-1, keepdims=True)
    o = conv((beta @ v).reshape(b, h, w, -1), wo)
    return x + gamma * o, beta


@pytest.mark.slow
def test_layer_contract():
    x = RNG.normal(size=(2, 4, 6, 16)).astype("float32")
    kwargs = {"gamma_initializer": "ones", "seed": 1}
    run_layer_test(SelfAttention2D, kwargs, x, expected_output_shape=(2, 4, 6, 16))
    run_layer_test(
        SelfAttention2D,
        {**kwargs, "pool": False, "spectral_norm": False},
        x,
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=[(2, 4, 6, 16), (2, 24, 24)],
        run_training=False,
        run_mixed_precision=False,
        tflite_static_and_dynamic=False,
    )


@pytest.mark.parametrize("pool", [True, False])
def test_matches_numpy_reference(pool):
    x = RNG.normal(size=(2, 4, 4, 16)).astype("float32")
    layer = SelfAttention2D(pool=pool, gamma_initializer=keras.initializers.Constant(0.7), seed=3)
    y, scores = layer(x, return_attention_scores=True)
    kernels = [
        np.asarray(c.normalized_kernel())
        for c in (layer.query_conv, layer.key_conv, layer.value_conv, layer.output_conv)
    ]
    want_y, want_scores = _numpy_sagan(x.astype("float64"), *kernels, 0.7, pool)
    np.testing.assert_allclose(np.asarray(scores), want_scores, atol=1e-5)
    np.testing.assert_allclose(np.asarray(y), want_y, atol=1e-5)
    # Each query's weights are a distribution over N/4 (pooled) or N keys.
    assert scores.shape == (2, 16, 4 if pool else 16)


def test_gamma_zero_is_identity_even_after_training_steps_on_convs():
    x = RNG.normal(size=(3, 8, 8, 16)).astype("float32")
    layer = SelfAttention2D()
    y = layer(x, training=True)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert float(layer.gamma.numpy()) == 0.0


@pytest.mark.slow
def test_static_batch1_tflite_has_rank_at_most_4():
    inputs = keras.Input((8, 8, 16), batch_size=1, name="x")
    model = keras.Model(inputs, SelfAttention2D(gamma_initializer="ones")(inputs))
    result = tflite_convert_and_run(model, {"x": RNG.normal(size=(1, 8, 8, 16)).astype("float32")})
    assert result.max_abs_diff < 1e-5
    from export.check import check_model

    problems = check_model(result.model_bytes, "gpu")
    assert not problems, [str(p) for p in problems]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, message", [({"key_ratio": 0}, "key_ratio=0"), ({"value_ratio": 32}, "value_ratio=32")]
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelfAttention2D(**kwargs)(np.zeros((1, 4, 4, 16), "float32"))
