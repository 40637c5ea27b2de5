"""`--ema`: evaluation sees the moving average of the weights, training keeps
the raw weights (train.engine.averaged_weights), checked against a NumPy average."""

import keras
import numpy as np
import pytest

from train import engine
from train.model_step import TfModelStep

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


def _train(model, batches):
    """The engine's step on each batch; returns the raw weights after every step."""
    step = TfModelStep(model)
    step.build(batches[0])
    weights = []
    for i, batch in enumerate(batches):
        step.train(batch, engine.At(i, 0.0))
        weights.append([v.numpy().copy() for v in model.trainable_variables])
    return weights


def _model(use_ema):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    averaging = dict(use_ema=True, ema_momentum=0.8) if use_ema else {}
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, **averaging), loss=keras.losses.MeanSquaredError()
    )
    return model


def test_averaged_weights_are_the_moving_average_and_raw_weights_come_back():
    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32"))
        for _ in range(6)
    ]
    model = _model(True)
    weights = _train(model, batches)
    # Keras's EMA: the first step copies the weights, then avg = m * avg + (1 - m) * w.
    expected = weights[0]
    for step in weights[1:]:
        expected = [0.8 * a + 0.2 * w for a, w in zip(expected, step)]
    raw = weights[-1]
    assert max(float(np.max(np.abs(a - w))) for a, w in zip(expected, raw)) > 1e-3
    with engine.averaged_weights(model):
        inside = [v.numpy() for v in model.trainable_variables]
    for got, want in zip(inside, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for got, want in zip(model.trainable_variables, raw):
        np.testing.assert_array_equal(got.numpy(), want)


def test_without_ema_the_context_changes_nothing():
    model = _model(False)
    _train(model, [(np.ones((2, 3), "float32"), np.zeros((2, 2), "float32"))])
    before = [v.numpy() for v in model.trainable_variables]
    with engine.averaged_weights(model):
        inside = [v.numpy() for v in model.trainable_variables]
    for a, b in zip(before, inside):
        np.testing.assert_array_equal(a, b)
