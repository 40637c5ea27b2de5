"""TokenAndPositionEmbedding: Keras embedding plus positions, masks, TFLite, bad input."""

import keras
import numpy as np
import pytest

from layers import TokenAndPositionEmbedding
from tests.layers.test_sinusoidal_position_encoding import vaswani_encoding
from tests.support.harness import run_layer_test, tflite_convert_and_run

RNG = np.random.default_rng(3)


@pytest.mark.slow
@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_token_and_position_layer_contract(position):
    ids = RNG.integers(1, 30, size=(2, 5)).astype("int32")
    run_layer_test(
        TokenAndPositionEmbedding,
        {
            "vocabulary_size": 30,
            "sequence_length": 8,
            "embedding_dim": 6,
            "position": position,
            "scale_by_sqrt_dim": position == "sinusoidal",
        },
        ids,
        call_kwargs={"start_index": 1},
        expected_output_shape=(2, 5, 6),
    )


@pytest.mark.parametrize("scale", [False, True])
def test_token_and_learned_position_equals_keras_embedding_plus_table(scale):
    layer = TokenAndPositionEmbedding(20, 8, 6, scale_by_sqrt_dim=scale)
    ids = RNG.integers(0, 20, size=(3, 5)).astype("int32")
    out = np.asarray(layer(ids, start_index=2))
    keras_embedding = keras.layers.Embedding(20, 6)
    keras_embedding.build((None, None))
    keras_embedding.set_weights(layer.token_embedding.get_weights())
    tokens = np.asarray(keras_embedding(ids)) * (np.sqrt(6.0) if scale else 1.0)
    table = layer.position_embedding.get_weights()[0]
    np.testing.assert_allclose(out, tokens + table[2:7], atol=1e-6)


def test_token_and_sinusoidal_position_matches_paper_formula():
    layer = TokenAndPositionEmbedding(20, 16, 6, position="sinusoidal")
    ids = RNG.integers(0, 20, size=(2, 7)).astype("int32")
    out = np.asarray(layer(ids, start_index=3))
    table = layer.token_embedding.get_weights()[0]
    np.testing.assert_allclose(out, table[ids] + vaswani_encoding(7, 6, 3), atol=2e-6)
    assert len(layer.weights) == 1  # sinusoidal positions have no weights


def test_token_and_position_mask_zero_propagates():
    layer = TokenAndPositionEmbedding(20, 8, 6, mask_zero=True)
    ids = np.array([[4, 5, 0, 0], [3, 0, 0, 0]], "int32")
    np.testing.assert_array_equal(np.asarray(layer.compute_mask(ids)), ids != 0)
    inputs = keras.Input((None,), dtype="int32")
    embedded = layer(inputs)
    # The mask reaches a downstream consumer: masked mean pooling ignores padding.
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    model = keras.Model(inputs, pooled)
    full = np.asarray(layer(ids))
    want = np.stack([full[0, :2].mean(0), full[1, :1].mean(0)])
    np.testing.assert_allclose(np.asarray(model(ids)), want, atol=1e-6)
    assert TokenAndPositionEmbedding(20, 8, 6).compute_mask(ids) is None


@pytest.mark.slow
def test_token_and_position_tflite_uses_1d_gather_without_select():
    model_in = keras.Input((None,), dtype="int32", name="ids")
    model = keras.Model(model_in, TokenAndPositionEmbedding(20, 8, 6)(model_in))
    ids = RNG.integers(0, 20, size=(2, 5)).astype("int32")
    for dynamic in (None, {"ids": (0, 1)}):
        result = tflite_convert_and_run(model, {"ids": ids}, dynamic_axes=dynamic)
        assert result.max_abs_diff <= 1e-6
        assert result.ops.count("GATHER") == 1, result.ops
        assert not {"SELECT", "SELECT_V2", "GATHER_ND"} & set(result.ops), result.ops


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"vocabulary_size": 0}, "vocabulary_size=0"),
        ({"sequence_length": -1}, "sequence_length=-1"),
        ({"embedding_dim": 0}, "embedding_dim=0"),
        ({"embedding_dim": 2.5}, "embedding_dim=2.5"),
        ({"position": "relative"}, "position='relative'"),
    ],
)
def test_token_and_position_bad_arguments(kwargs, name):
    args = {"vocabulary_size": 10, "sequence_length": 8, "embedding_dim": 4, **kwargs}
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        TokenAndPositionEmbedding(**args)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_token_and_position_too_long_raises(position):
    layer = TokenAndPositionEmbedding(10, 4, 4, position=position)
    with pytest.raises(ValueError, match=r"sequence_length=4.*length=6"):
        layer(np.ones((1, 5), "int32"), start_index=1)


def test_token_and_position_wrong_rank():
    with pytest.raises(ValueError, match=r"rank 2.*\(2, 3, 4\)"):
        TokenAndPositionEmbedding(10, 4, 4)(np.ones((2, 3, 4), "int32"))
