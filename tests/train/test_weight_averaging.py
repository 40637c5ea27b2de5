"""`--ema-momentum`: evaluation sees the moving average of the weights, training keeps
the raw weights (train.engine.averaged_weights), checked against a NumPy average."""

import keras
import numpy as np
import pytest

from train import engine

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


class _Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append([v.numpy().copy() for v in self.model.trainable_variables])


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
    model, record = _model(True), _Record()
    engine.fit(model, batches, epochs=1, callbacks=[record], verbose=0)
    # Keras's EMA: the first step copies the weights, then avg = m * avg + (1 - m) * w.
    expected = record.weights[0]
    for step in record.weights[1:]:
        expected = [0.8 * a + 0.2 * w for a, w in zip(expected, step)]
    raw = record.weights[-1]
    assert max(float(np.max(np.abs(a - w))) for a, w in zip(expected, raw)) > 1e-3
    with engine.averaged_weights(model):
        inside = [v.numpy() for v in model.trainable_variables]
    for got, want in zip(inside, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for got, want in zip(model.trainable_variables, raw):
        np.testing.assert_array_equal(got.numpy(), want)


def test_without_ema_the_context_changes_nothing():
    model = _model(False)
    engine.fit(
        model, [(np.ones((2, 3), "float32"), np.zeros((2, 2), "float32"))], epochs=1, verbose=0
    )
    before = [v.numpy() for v in model.trainable_variables]
    with engine.averaged_weights(model):
        inside = [v.numpy() for v in model.trainable_variables]
    for a, b in zip(before, inside):
        np.testing.assert_array_equal(a, b)
