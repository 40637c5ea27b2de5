"""PositionEmbedding: table rows from start_index, in graphs and TFLite, bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import PositionEmbedding
from tests.support.harness import run_layer_test, tflite_convert_and_run

RNG = np.random.default_rng(3)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)


@pytest.mark.slow
def test_position_embedding_layer_contract():
    x = RNG.normal(size=(2, 5, 6)).astype("float32")
    run_layer_test(
        PositionEmbedding,
        {"sequence_length": 9},
        x,
        call_kwargs={"start_index": 2},
        expected_output_shape=(2, 5, 6),
        input_mask=MASK,
        supports_masking=True,
    )


def test_position_embedding_returns_table_rows_from_start_index():
    layer = PositionEmbedding(sequence_length=10)
    x = np.zeros((3, 4, 5), "float32")
    layer(x)
    table = layer.get_weights()[0]
    assert table.shape == (10, 5)
    for k in (0, 2, 6):
        out = np.asarray(layer(x, start_index=k))
        np.testing.assert_array_equal(out, np.broadcast_to(table[k : k + 4], (3, 4, 5)))


def test_position_embedding_tensor_start_index_in_graph():
    layer = PositionEmbedding(sequence_length=10)
    x = np.zeros((2, 3, 4), "float32")
    layer(x)
    table = layer.get_weights()[0]

    @tf.function(input_signature=[tf.TensorSpec((None, None, 4)), tf.TensorSpec((), tf.int32)])
    def f(inputs, start):
        return layer(inputs, start_index=start)

    np.testing.assert_array_equal(
        np.asarray(f(x, tf.constant(5))), np.broadcast_to(table[5:8], x.shape)
    )


@pytest.mark.slow
def test_position_embedding_tensor_start_index_converts_to_tflite():
    layer = PositionEmbedding(sequence_length=10)
    x = RNG.normal(size=(2, 3, 4)).astype("float32")
    inputs = keras.Input((None, 4), name="x")
    start = keras.Input((), batch_size=1, dtype="int32", name="start")
    out = layer(inputs, start_index=keras.ops.reshape(start, ()))
    model = keras.Model({"x": inputs, "start": start}, out)
    feed = {"x": x, "start": np.array([6], "int32")}
    result = tflite_convert_and_run(model, feed, dynamic_axes={"x": (0, 1)})
    assert result.max_abs_diff <= 1e-6
    table = layer.get_weights()[0]
    np.testing.assert_array_equal(result.outputs[0], np.broadcast_to(table[6:9], x.shape))


@pytest.mark.parametrize("length, start", [(9, 0), (5, 4), (1, 8)])
def test_position_embedding_too_long_raises(length, start):
    layer = PositionEmbedding(sequence_length=8)
    x = np.zeros((1, length, 4), "float32")
    received = f"length={length + start}"
    with pytest.raises(ValueError, match=r"sequence_length=8") as info:
        layer(x, start_index=start)
    assert received in str(info.value)
    with pytest.raises(ValueError, match=received):
        layer(x, start_index=tf.constant(start))  # eager tensor: known now


def test_position_embedding_longest_sequence_is_fine():
    layer = PositionEmbedding(sequence_length=8)
    assert tuple(layer(np.zeros((1, 5, 4), "float32"), start_index=3).shape) == (1, 5, 4)


def test_position_embedding_dynamic_overflow_fails_at_run_time_in_tensorflow():
    # Documented: with a run-time length no static check exists; TF's slice raises.
    layer = PositionEmbedding(sequence_length=4)
    layer(np.zeros((1, 2, 3), "float32"))

    @tf.function(input_signature=[tf.TensorSpec((1, None, 3)), tf.TensorSpec((), tf.int32)])
    def f(inputs, start):
        return layer(inputs, start_index=start)

    with pytest.raises(tf.errors.InvalidArgumentError):
        f(np.zeros((1, 3, 3), "float32"), tf.constant(2))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sequence_length": 0}, "sequence_length=0"),
        ({"sequence_length": "8"}, "sequence_length='8'"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PositionEmbedding(**kwargs)


def test_negative_start_index():
    with pytest.raises(ValueError, match="start_index=-1"):
        PositionEmbedding(4)(np.zeros((1, 2, 4), "float32"), start_index=-1)


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"rank 3.*\(2, 4\)"):
        PositionEmbedding(4)(np.zeros((2, 4), "float32"))
