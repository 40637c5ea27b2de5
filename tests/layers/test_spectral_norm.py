"""Spectral normalisation: NumPy power iteration, gradient through sigma, layer contract."""

import numpy as np
import pytest
import tensorflow as tf

from layers import SNConv2D, SNDense
from tests.support.harness import run_layer_test

RNG = np.random.default_rng(3)


def _numpy_power_iteration(w, u, steps):
    """Miyato et al. Algorithm 1 on W [n_in, n_out], u [1, n_out]."""
    for _ in range(steps):
        v = u @ w.T
        v = v / np.linalg.norm(v)
        u = v @ w
        u = u / np.linalg.norm(u)
    return u, float((v @ w @ u.T).item())


@pytest.mark.slow
def test_sn_conv_layer_contract():
    x = RNG.normal(size=(2, 6, 6, 3)).astype("float32")
    run_layer_test(
        SNConv2D, {"filters": 4, "kernel_size": 3, "seed": 1}, x, expected_output_shape=(2, 6, 6, 4)
    )


@pytest.mark.slow
def test_sn_dense_layer_contract():
    x = RNG.normal(size=(2, 5, 4)).astype("float32")
    run_layer_test(
        SNDense,
        {"units": 3, "seed": 1},
        x,
        expected_output_shape=(2, 5, 3),
        input_mask=np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool),
        supports_masking=True,
    )


def test_u_and_sigma_follow_numpy_power_iteration():
    layer = SNConv2D(5, 3, use_bias=False, seed=7)
    x = RNG.normal(size=(1, 4, 4, 2)).astype("float32")
    layer(x)
    w = layer.kernel.numpy().reshape(-1, 5).astype("float64")
    u0 = layer.u.numpy().astype("float64")
    for step in range(1, 4):
        layer(x, training=True)
        u_ref, sigma_ref = _numpy_power_iteration(w, u0, step)
        np.testing.assert_allclose(layer.u.numpy(), u_ref, atol=1e-5)
    # Converges to the largest singular value; the effective kernel has norm 1.
    for _ in range(200):
        layer(x, training=True)
    top = np.linalg.svd(w, compute_uv=False)[0]
    assert abs(float(layer.sigma()) - top) < 1e-3 * top
    w_sn = np.asarray(layer.normalized_kernel()).reshape(-1, 5)
    assert abs(np.linalg.svd(w_sn, compute_uv=False)[0] - 1.0) < 1e-3


def test_inference_does_not_move_u():
    layer = SNDense(3, seed=2)
    x = RNG.normal(size=(4, 6)).astype("float32")
    layer(x)
    u = layer.u.numpy().copy()
    a = np.asarray(layer(x))
    b = np.asarray(layer(x, training=False))
    np.testing.assert_array_equal(layer.u.numpy(), u)
    np.testing.assert_array_equal(a, b)


def test_gradient_flows_through_sigma():
    """Layer gradient == finite differences of x @ (W / sigma(W)) with u fixed."""
    layer = SNDense(3, use_bias=False, seed=4)
    x = RNG.normal(size=(5, 4)).astype("float32")
    r = RNG.normal(size=(5, 3))
    layer(x)
    w = layer.kernel.numpy().astype("float64")
    u = layer.u.numpy().astype("float64")

    # The paper treats the power-iteration vectors as constants: sigma(W') = v W' u^T
    # with u, v from the current W; the gradient goes through W' only.
    v = u @ w.T
    v /= np.linalg.norm(v)
    u1 = v @ w
    u1 /= np.linalg.norm(u1)

    def loss_np(w_):
        sigma = (v @ w_ @ u1.T).item()
        return float(np.sum(r * (x.astype("float64") @ (w_ / sigma))))

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.constant(r, tf.float32) * layer(x, training=False))
    grad = tape.gradient(loss, layer.kernel.value).numpy()
    numeric = np.zeros_like(w)
    h = 1e-5
    for idx in np.ndindex(*w.shape):
        plus, minus = w.copy(), w.copy()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = (loss_np(plus) - loss_np(minus)) / (2 * h)
    np.testing.assert_allclose(grad, numeric, atol=2e-3)
    # With sigma held constant (keras.layers.SpectralNormalization) it differs.
    _, sigma = _numpy_power_iteration(w, u, 1)
    no_sigma_grad = x.astype("float64").T @ r / sigma
    assert np.max(np.abs(no_sigma_grad - numeric)) > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"filters": 0, "kernel_size": 3}, "filters=0"),
        ({"filters": 2, "kernel_size": 3, "padding": "causal"}, "padding='causal'"),
        ({"filters": 2, "kernel_size": 3, "power_iterations": 0}, "power_iterations=0"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SNConv2D(**kwargs)
