"""TokenEmbedding: equal to keras.layers.Embedding, 1-D GATHER in TFLite."""

import keras
import numpy as np
import pytest

from layers import TokenEmbedding
from tests.support.harness import run_layer_test, tflite_convert_and_run, tflite_op_details

RNG = np.random.default_rng(5)


@pytest.mark.slow
@pytest.mark.parametrize("mask_zero", [False, True])
def test_token_embedding_layer_contract(mask_zero):
    ids = RNG.integers(1, 17, size=(3, 5)).astype("int32")
    run_layer_test(
        TokenEmbedding,
        {"input_dim": 17, "output_dim": 6, "mask_zero": mask_zero},
        ids,
        expected_output_shape=(3, 5, 6),
    )


@pytest.mark.parametrize("shape", [(4,), (3, 5), (2, 3, 4)])
def test_equals_keras_embedding_with_copied_weights(shape):
    ids = RNG.integers(0, 11, size=shape)
    ours = TokenEmbedding(11, 4, mask_zero=True)
    ours.build(None)
    reference = keras.layers.Embedding(11, 4, mask_zero=True)
    reference.build(None)
    reference.set_weights(ours.get_weights())
    np.testing.assert_array_equal(np.asarray(ours(ids)), np.asarray(reference(ids)))
    np.testing.assert_array_equal(
        np.asarray(ours.compute_mask(ids)), np.asarray(reference.compute_mask(ids))
    )


def test_weights_copy_from_keras_embedding_and_keep_layout():
    reference = keras.layers.Embedding(9, 3)
    reference.build(None)
    ours = TokenEmbedding(9, 3)
    ours.build(None)
    ours.set_weights(reference.get_weights())
    assert [w.shape for w in ours.weights] == [w.shape for w in reference.weights]
    assert [w.name for w in ours.weights] == [w.name for w in reference.weights]
    ids = np.array([[0, 8, 3]])
    np.testing.assert_array_equal(np.asarray(ours(ids)), np.asarray(reference(ids)))


def test_int64_and_float_ids_are_accepted():
    layer = TokenEmbedding(5, 2)
    layer.build(None)
    table = layer.get_weights()[0]
    ids = np.array([[4, 1]])
    np.testing.assert_array_equal(np.asarray(layer(ids.astype("int64"))), table[ids])
    np.testing.assert_array_equal(np.asarray(layer(ids.astype("float32"))), table[ids])


def test_mixed_precision_keeps_float32_table_and_casts_rows():
    layer = TokenEmbedding(5, 2, dtype="mixed_bfloat16")
    out = layer(np.array([[1, 2]]))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(layer.embeddings.dtype) == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_tflite_is_a_single_1d_int32_gather(dynamic):
    ids_in = keras.Input((None,), dtype="int32", name="ids")
    model = keras.Model(ids_in, TokenEmbedding(13, 4)(ids_in))
    ids = RNG.integers(0, 13, size=(2, 6)).astype("int32")
    result = tflite_convert_and_run(
        model, {"ids": ids}, dynamic_axes={"ids": (0, 1)} if dynamic else None
    )
    assert result.max_abs_diff == 0.0
    gathers = [d for d in tflite_op_details(result.model_bytes) if d["op"] == "GATHER"]
    assert len(gathers) == 1, result.ops
    assert gathers[0]["inputs"] == ["FLOAT32", "INT32"]
    assert len(gathers[0]["input_shapes"][1]) == 1  # 1-D indices
    assert not {"SELECT", "SELECT_V2", "GATHER_ND", "CAST"} & set(result.ops), result.ops


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_dim": 0, "output_dim": 3}, "input_dim=0"),
        ({"input_dim": 4, "output_dim": -2}, "output_dim=-2"),
        ({"input_dim": 4.0, "output_dim": 2}, r"input_dim=4\.0"),
    ],
)
def test_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TokenEmbedding(**kwargs)
