"""The shared layer test passes good layers and fails each kind of broken one."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from tests.support.harness import (
    assert_builtin_only,
    run_layer_test,
    tflite_convert_and_run,
    tflite_ops,
)

RNG = np.random.default_rng(1)
X = RNG.normal(size=(2, 5, 4)).astype("float32")
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
PACKAGE = "test_harness"


# ------------------------------------------------------------- good layers


@pytest.mark.slow
def test_dense_passes_every_stage():
    layer = run_layer_test(
        keras.layers.Dense,
        {"units": 3},
        X,
        expected_output_shape=(2, 5, 3),
        input_mask=MASK,
        supports_masking=True,
    )
    assert layer.built and layer.kernel.shape == (4, 3)


@pytest.mark.slow
def test_dict_inputs_with_keras_multi_head_attention():
    value = RNG.normal(size=(2, 6, 4)).astype("float32")
    run_layer_test(
        keras.layers.MultiHeadAttention,
        {"num_heads": 2, "key_dim": 2},
        {"query": X, "value": value},
        expected_output_shape=(2, 5, 4),
        run_mixed_precision=False,
    )


@keras.saving.register_keras_serializable(package=PACKAGE)
class TwoOutputs(keras.layers.Layer):
    """Returns (x @ w, sum over features): exercises tuple outputs."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 2), name="w")

    def call(self, x):
        return ops.matmul(x, self.w), ops.sum(x, axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (2,), tuple(input_shape[:-1])


@pytest.mark.slow
def test_tuple_outputs_are_all_compared():
    run_layer_test(TwoOutputs, {}, X, expected_output_shape=[(2, 5, 2), (2, 5)])
    with pytest.raises(AssertionError, match="stage 'eager'.*expected_output_shape"):
        run_layer_test(TwoOutputs, {}, X, expected_output_shape=[(2, 5, 2), (2, 4)])


# ----------------------------------------------------------- broken layers


class Unregistered(keras.layers.Layer):
    def call(self, x):
        return x * 2.0

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class WrongShape(keras.layers.Layer):
    def call(self, x):
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (input_shape[-1] + 1,)


@keras.saving.register_keras_serializable(package=PACKAGE)
class EagerOnlyOffset(keras.layers.Layer):
    """Adds 1 only when run eagerly, so the exported graph differs from Keras."""

    def call(self, x):
        if tf.executing_eagerly():
            return x + 1.0
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class FlexOp(keras.layers.Layer):
    """keras.ops.argmax on floats lowers to BitwiseAnd, a Flex op (docs/facts.md)."""

    def call(self, x):
        index = ops.cast(ops.argmax(x, axis=-1), x.dtype)
        return x + ops.expand_dims(index, -1)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class AlwaysFloat32(keras.layers.Layer):
    def call(self, x):
        return ops.cast(x, "float32") * 2.0

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class DropsMask(keras.layers.Layer):
    def call(self, x):
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class DeadWeight(keras.layers.Layer):
    """Has a trainable weight that never reaches the output."""

    def build(self, input_shape):
        self.unused = self.add_weight(shape=(3,), name="unused")

    def call(self, x):
        return x * 3.0

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class ForgetsConfig(keras.layers.Layer):
    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):  # forgets `factor`
        return super().get_config()


@keras.saving.register_keras_serializable(package=PACKAGE)
class EagerInputsOnly(keras.layers.Layer):
    """Needs a static sequence length: fails on keras.Input with None."""

    def call(self, x):
        return ops.reshape(x, (-1, x.shape[1] * x.shape[2]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1] * input_shape[2])


@pytest.mark.slow
@pytest.mark.parametrize(
    "layer_cls, kwargs, stage",
    [
        (Unregistered, {}, "saving"),
        (WrongShape, {}, "eager"),
        (EagerInputsOnly, {}, "symbolic"),
        (ForgetsConfig, {"factor": 3.0}, "config"),
        (DeadWeight, {}, "training"),
        (AlwaysFloat32, {}, r"mixed_precision\[mixed_float16\]"),
        (EagerOnlyOffset, {}, "tflite_static"),
        (FlexOp, {}, "tflite_static"),
    ],
)
def test_broken_layer_fails_at_the_right_stage(layer_cls, kwargs, stage):
    with pytest.raises(AssertionError, match=rf"\[{layer_cls.__name__}\] stage '{stage}'"):
        run_layer_test(layer_cls, kwargs, X)


def test_layer_that_drops_the_mask_fails_masking():
    with pytest.raises(AssertionError, match="stage 'masking'"):
        run_layer_test(DropsMask, {}, X, input_mask=MASK, supports_masking=True, run_tflite=False)


@pytest.mark.slow
def test_tflite_tolerance_is_honoured():
    # EagerOnlyOffset's TFLite output is off by exactly 1.
    kwargs = {"run_training": False, "run_mixed_precision": False}
    run_layer_test(EagerOnlyOffset, {}, X, tflite_atol=1.01, **kwargs)
    with pytest.raises(AssertionError, match="stage 'tflite_static'.*tflite_atol=0.99"):
        run_layer_test(EagerOnlyOffset, {}, X, tflite_atol=0.99, **kwargs)


# --------------------------------------------------------- tflite utilities


def test_tflite_ops_lists_builtins_and_flags_custom():
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    result = tflite_convert_and_run(model, {"x": np.ones((1, 3), "float32")})
    assert result.ops == ["FULLY_CONNECTED"]
    assert tflite_ops(result.model_bytes) == result.ops
    np.testing.assert_allclose(result.outputs[0], result.expected[0], atol=1e-6)
    assert_builtin_only(result.ops)
    with pytest.raises(AssertionError, match="FlexBitwiseAnd"):
        assert_builtin_only(["ADD", "CUSTOM:FlexBitwiseAnd"])
