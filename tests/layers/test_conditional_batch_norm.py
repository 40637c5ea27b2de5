"""ConditionalBatchNormalization: NumPy formula, batch-size independence, layer contract."""

import numpy as np
import pytest

from layers import ConditionalBatchNormalization
from tests.support.harness import run_layer_test

RNG = np.random.default_rng(11)


def _data(b=6):
    x = (RNG.normal(size=(b, 4, 4, 5)) * 2 + 1).astype("float32")
    labels = RNG.integers(0, 3, size=(b,)).astype("int32")
    return x, labels


@pytest.mark.slow
def test_layer_contract():
    x, labels = _data()
    run_layer_test(
        ConditionalBatchNormalization,
        {
            "num_classes": 3,
            "gamma_initializer": "random_normal",
            "beta_initializer": "random_normal",
        },
        {"inputs": x, "labels": labels},
        expected_output_shape=(6, 4, 4, 5),
        dynamic_axes={"inputs": (0,), "labels": (0,)},
    )


def test_training_matches_numpy_and_updates_moving_statistics():
    x, labels = _data()
    layer = ConditionalBatchNormalization(
        3, momentum=0.9, gamma_initializer="random_normal", beta_initializer="random_normal"
    )
    y = np.asarray(layer(x, labels, training=True))
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    want = (x - mean) / np.sqrt(var + 1e-5) * gamma[labels][:, None, None] + beta[labels][
        :, None, None
    ]
    np.testing.assert_allclose(y, want, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.1 * mean, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 + 0.1 * var, atol=1e-5)


def test_inference_is_batch_size_independent():
    x, labels = _data(8)
    layer = ConditionalBatchNormalization(3, gamma_initializer="random_normal")
    for _ in range(3):
        layer(x * 3 - 2, labels, training=True)
    whole = np.asarray(layer(x, labels, training=False))
    rows = np.concatenate([np.asarray(layer(x[i : i + 1], labels[i : i + 1])) for i in range(8)])
    np.testing.assert_allclose(whole, rows, atol=1e-6)
    # ... and uses the moving statistics (NumPy formula).
    m, v = layer.moving_mean.numpy(), layer.moving_variance.numpy()
    g, b = layer.gamma.numpy()[labels][:, None, None], layer.beta.numpy()[labels][:, None, None]
    np.testing.assert_allclose(whole, (x - m) / np.sqrt(v + 1e-5) * g + b, atol=1e-4)


def test_synchronized_on_one_replica_is_the_plain_batch_norm_and_round_trips():
    """Outside a multi-replica context (here: one device, in and out of tf.function) the
    local statistics are the global ones. Two replicas: tests/train/test_sagan_distributed.py."""
    import tensorflow as tf

    x, labels = _data()
    layer = ConditionalBatchNormalization(3, synchronized=True, gamma_initializer="random_normal")
    eager = np.asarray(layer(x, labels, training=True))
    graph = np.asarray(tf.function(lambda a, b: layer(a, b, training=True))(x, labels))
    g = layer.gamma.numpy()[labels][:, None, None]
    want = (x - x.mean(axis=(0, 1, 2))) / np.sqrt(x.var(axis=(0, 1, 2)) + 1e-5) * g
    np.testing.assert_allclose(eager, want, atol=1e-4)
    np.testing.assert_allclose(graph, want, atol=1e-4)
    config = layer.get_config()
    assert config["synchronized"] is True
    assert ConditionalBatchNormalization.from_config(config).synchronized is True
    assert ConditionalBatchNormalization(3).get_config()["synchronized"] is False


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_classes": 0}, "num_classes=0"),
        ({"num_classes": 2, "momentum": 1.0}, "momentum=1.0"),
        ({"num_classes": 2, "synchronized": "yes"}, "synchronized='yes'"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConditionalBatchNormalization(**kwargs)
