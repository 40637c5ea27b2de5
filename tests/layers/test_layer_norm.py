"""LayerNorm: equal to keras.layers.LayerNormalization, fully quantizable."""

import keras
import numpy as np
import pytest
from keras import ops

from layers import LayerNorm
from tests.support.harness import run_layer_test, tflite_convert_and_run, tflite_op_details

RNG = np.random.default_rng(9)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)


def _randomize(layer):
    layer.set_weights([RNG.normal(size=w.shape).astype("float32") for w in layer.get_weights()])


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{}, {"axis": [1, 2], "center": False}])
def test_layer_norm_layer_contract(kwargs):
    x = RNG.normal(size=(2, 5, 6)).astype("float32") * 3 + 1
    run_layer_test(
        LayerNorm,
        kwargs,
        x,
        expected_output_shape=(2, 5, 6),
        input_mask=MASK,
        supports_masking=True,
        # [1, 2] normalizes over the sequence axis, which must stay static.
        dynamic_axes={"inputs": (0,)} if kwargs else None,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ((3, 5, 8), {}),
        ((3, 5, 8), {"center": False}),
        ((3, 5, 8), {"scale": False}),
        ((3, 5, 8), {"center": False, "scale": False}),
        ((2, 4, 3, 6), {"axis": [2, 3]}),
        ((2, 4, 3, 6), {"axis": 1}),
        ((2, 4, 3, 6), {"axis": [-1, 1]}),
        ((4, 7), {"epsilon": 1e-3}),
    ],
)
def test_equals_keras_layer_normalization_with_copied_weights(shape, kwargs):
    x = (RNG.normal(size=shape) * 4 + 2).astype("float32")
    ours = LayerNorm(**kwargs)
    ours(x)
    _randomize(ours)
    reference = keras.layers.LayerNormalization(**{"epsilon": 1e-5, **kwargs})
    reference(x)
    assert [(w.name, w.shape) for w in ours.weights] == [
        (w.name, w.shape) for w in reference.weights
    ]
    reference.set_weights(ours.get_weights())
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(reference(x)), atol=2e-5)


def test_statistics_in_float32_under_mixed_precision():
    # A large offset with a small spread: float16 statistics would lose it.
    x = (300.0 + RNG.normal(size=(2, 3, 64))).astype("float32")
    reference = np.asarray(LayerNorm()(x))
    layer = LayerNorm(dtype="mixed_float16")
    out = layer(x.astype("float16"))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    # float16 input already rounds x to ~0.25 at 300; float32 stats keep the rest.
    np.testing.assert_allclose(np.asarray(out, "float32"), reference, atol=0.3)
    assert [keras.backend.standardize_dtype(w.dtype) for w in layer.weights] == ["float32"] * 2


def _quantize_model(norm_layer):
    x = keras.Input((6, 8), batch_size=1, name="x")
    h = keras.layers.Dense(8)(x)
    y = keras.layers.Dense(4)(norm_layer(h))
    model = keras.Model(x, y)
    _randomize(norm_layer)
    samples = [{"x": RNG.normal(size=(1, 6, 8)).astype("float32")} for _ in range(24)]
    return model, samples


def _float_islands(model_bytes):
    """Ops computing in float inside a quantized model (besides the I/O ones)."""
    return [
        d["op"]
        for d in tflite_op_details(model_bytes)
        if d["op"] not in ("QUANTIZE", "DEQUANTIZE") and "FLOAT32" in d["inputs"] + d["outputs"]
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "quantize, activation_type, tolerance",
    [("int8", "INT8", 0.15), ("int16x8", "INT16", 0.03)],
)
def test_full_integer_quantization_has_no_float_island(quantize, activation_type, tolerance):
    model, samples = _quantize_model(LayerNorm())
    result = tflite_convert_and_run(
        model, samples[0], quantize=quantize, representative_data=samples
    )
    assert "NEG" not in result.ops
    assert _float_islands(result.model_bytes) == [], result.ops
    for op in ("MEAN", "SUB", "RSQRT", "MUL", "ADD"):
        assert op in result.ops, result.ops
    for detail in tflite_op_details(result.model_bytes):
        if detail["op"] in ("MEAN", "SUB", "RSQRT"):
            assert detail["outputs"] == [activation_type], detail
    scale = max(1.0, float(np.max(np.abs(result.expected[0]))))
    assert result.max_abs_diff <= tolerance * scale


class NegLayerNorm(keras.layers.Layer):
    """LayerNorm with an explicit NEG: what the check above must catch."""

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=input_shape[-1:], initializer="ones", name="gamma")

    def call(self, x):
        # Keras's formulation: x * inv - mean * inv, with the NEG kept.
        mean = ops.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        inv = ops.rsqrt(ops.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * self.gamma
        return x * inv + ops.negative(mean) * inv


@pytest.mark.slow
def test_float_island_check_catches_neg():
    model, samples = _quantize_model(NegLayerNorm())
    result = tflite_convert_and_run(model, samples[0], quantize="int8", representative_data=samples)
    assert "NEG" in _float_islands(result.model_bytes)


@pytest.mark.slow
def test_gpu_friendly_broadcasts():
    # Each binary op has one operand of the output's shape: no [1,T,1] x [D] MUL.
    x = keras.Input((5, 8), batch_size=1, name="x")
    norm = LayerNorm()
    model = keras.Model(x, norm(x))
    _randomize(norm)
    result = tflite_convert_and_run(model, {"x": RNG.normal(size=(1, 5, 8)).astype("float32")})
    assert result.max_abs_diff <= 1e-5
    for detail in tflite_op_details(result.model_bytes):
        if detail["op"] in ("MUL", "ADD", "SUB"):
            shapes = detail["input_shapes"]
            full = max(shapes, key=len)
            assert full in ([1, 5, 8], [1, 5, 1]), detail
    assert not {"NEG", "SQUARED_DIFFERENCE", "BROADCAST_TO", "EXPAND_DIMS"} & set(result.ops)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 0.0}, "epsilon=0.0"),
        ({"epsilon": -1e-3}, "epsilon=-0.001"),
        ({"axis": "last"}, "axis='last'"),
        ({"axis": []}, r"axis=\[\]"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LayerNorm(**kwargs)


def test_axis_out_of_range_for_input():
    with pytest.raises(ValueError, match=r"rank 3.*axis=3"):
        LayerNorm(axis=3)(np.zeros((1, 2, 3), "float32"))
