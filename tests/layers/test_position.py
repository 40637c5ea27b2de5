"""Positional layers: paper formulas in NumPy, start_index, RoPE, bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from layers import (
    PositionEmbedding,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
    TokenAndPositionEmbedding,
)
from tests.support.harness import run_layer_test, tflite_convert_and_run

RNG = np.random.default_rng(3)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)


# ----------------------------------------------------------------- references


def vaswani_encoding(length, dim, start=0, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(same)."""
    pe = np.zeros((length, dim))
    for row in range(length):
        pos = start + row
        for j in range(dim):
            i = j // 2
            angle = pos / base ** (2 * i / dim)
            pe[row, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return pe


def rope_reference(x, positions, base=10000.0, scale=1.0):
    """RoPE as complex rotation (Su et al. eq. 13) on half-split pairs.

    Feature i and i + d/2 form the complex number x_i + 1j * x_{i+d/2}, which
    is multiplied by exp(1j * m * theta_i), theta_i = base^(-2i/d).
    `x` is [T, ..., d]; positions is [T].
    """
    x = np.asarray(x, "float64")
    half = x.shape[-1] // 2
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
    m = np.asarray(positions, "float64") / scale
    angle = m.reshape((-1,) + (1,) * (x.ndim - 1)) * theta
    z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


# ------------------------------------------------------------- shared harness


@pytest.mark.slow
@pytest.mark.parametrize("start_index", [0, 3])
def test_sinusoidal_layer_contract(start_index):
    x = RNG.normal(size=(2, 5, 6)).astype("float32")
    run_layer_test(
        SinusoidalPositionEncoding,
        {"max_wavelength": 100},
        x,
        call_kwargs={"start_index": start_index},
        expected_output_shape=(2, 5, 6),
        input_mask=MASK,
        supports_masking=True,
    )


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


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 5, 8), (2, 5, 3, 4)])
def test_rotary_layer_contract(shape):
    x = RNG.normal(size=shape).astype("float32")
    run_layer_test(
        RotaryEmbedding,
        {"max_wavelength": 500, "scaling_factor": 2.0},
        x,
        call_kwargs={"start_index": 4},
        expected_output_shape=shape,
        input_mask=MASK,
        supports_masking=True,
    )


# --------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("dim", [8, 7])
@pytest.mark.parametrize("start", [0, 6])
def test_sinusoidal_matches_paper_formula(dim, start):
    x = np.zeros((2, 11, dim), "float32")
    out = np.asarray(SinusoidalPositionEncoding()(x, start_index=start))
    want = vaswani_encoding(11, dim, start)
    np.testing.assert_allclose(out[0], want, atol=2e-5)
    np.testing.assert_array_equal(out[0], out[1])


@given(
    length=st.integers(1, 40),
    dim=st.integers(1, 33),
    start=st.integers(0, 500),
    base=st.sampled_from([100.0, 10000.0]),
)
def test_fuzz_sinusoidal_matches_paper_formula(length, dim, start, base):
    x = np.zeros((1, length, dim), "float32")
    out = np.asarray(SinusoidalPositionEncoding(max_wavelength=base)(x, start_index=start))
    # float32 angles up to ~540 rad: sin/cos error is a few ulp of the angle.
    np.testing.assert_allclose(out[0], vaswani_encoding(length, dim, start, base), atol=2e-4)


def test_sinusoidal_start_index_equals_rows_of_full_encoding():
    layer = SinusoidalPositionEncoding()
    full = np.asarray(layer(np.zeros((1, 12, 6), "float32")))
    for k in (1, 5, 9):
        part = np.asarray(layer(np.zeros((1, 3, 6), "float32"), start_index=k))
        np.testing.assert_allclose(part, full[:, k : k + 3], atol=1e-6)
        as_tensor = np.asarray(layer(np.zeros((1, 3, 6), "float32"), start_index=tf.constant(k)))
        np.testing.assert_allclose(as_tensor, full[:, k : k + 3], atol=1e-6)


# ---------------------------------------------------------------- learned


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


# ----------------------------------------------------------- token + position


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


# --------------------------------------------------------------------- RoPE


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 6, 8), (2, 6, 3, 4)])
@pytest.mark.parametrize("start, scale", [(0, 1.0), (7, 1.0), (7, 4.0)])
def test_rope_matches_complex_rotation(shape, start, scale):
    x = RNG.normal(size=shape).astype("float32")
    out = np.asarray(RotaryEmbedding(scaling_factor=scale)(x, start_index=start))
    positions = np.arange(shape[1]) + start
    for b in range(shape[0]):
        np.testing.assert_allclose(out[b], rope_reference(x[b], positions, scale=scale), atol=1e-5)


@given(
    length=st.integers(1, 12),
    half=st.integers(1, 8),
    start=st.integers(0, 300),
    base=st.sampled_from([10.0, 10000.0]),
)
def test_fuzz_rope_matches_complex_rotation(length, half, start, base):
    x = (
        np.random.default_rng(length * 100 + half)
        .normal(size=(1, length, 2 * half))
        .astype("float32")
    )
    out = np.asarray(RotaryEmbedding(max_wavelength=base)(x, start_index=start))
    want = rope_reference(x[0], np.arange(length) + start, base=base)
    np.testing.assert_allclose(out[0], want, atol=2e-4)


def test_rope_dot_product_depends_only_on_relative_position():
    rope = RotaryEmbedding()
    q = RNG.normal(size=(1, 1, 16)).astype("float32")
    k = RNG.normal(size=(1, 1, 16)).astype("float32")

    def score(m, n):
        return float(
            np.sum(np.asarray(rope(q, start_index=m)) * np.asarray(rope(k, start_index=n)))
        )

    for m, n in [(0, 3), (5, 1), (2, 2)]:
        base = score(m, n)
        for shift in (1, 17, 100):
            assert score(m + shift, n + shift) == pytest.approx(base, abs=1e-4)
    # and it does depend on the offset (not a trivial invariant)
    assert abs(score(0, 3) - score(0, 4)) > 1e-3


def test_rope_preserves_norm_and_is_identity_at_position_zero():
    x = RNG.normal(size=(2, 5, 2, 6)).astype("float32")
    out = np.asarray(RotaryEmbedding()(x, start_index=3))
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    first = np.asarray(RotaryEmbedding()(x[:, :1]))
    np.testing.assert_allclose(first, x[:, :1], atol=1e-7)


def test_rope_start_index_equals_slice_of_full_rotation():
    x = RNG.normal(size=(1, 10, 2, 4)).astype("float32")
    rope = RotaryEmbedding()
    full = np.asarray(rope(x))
    for k in (1, 6):
        part = np.asarray(rope(x[:, k : k + 3], start_index=k))
        np.testing.assert_allclose(part, full[:, k : k + 3], atol=1e-6)
        tensor = np.asarray(rope(x[:, k : k + 3], start_index=tf.constant(k)))
        np.testing.assert_allclose(tensor, full[:, k : k + 3], atol=1e-6)


@pytest.mark.slow
def test_rope_tensor_start_index_converts_to_tflite_rank_4():
    x = RNG.normal(size=(1, 1, 2, 4)).astype("float32")
    inputs = keras.Input((1, 2, 4), batch_size=1, name="x")
    index = keras.Input((), batch_size=1, dtype="int32", name="index")
    out = RotaryEmbedding()(inputs, start_index=keras.ops.reshape(index, ()))
    model = keras.Model({"x": inputs, "index": index}, out)
    result = tflite_convert_and_run(
        model,
        {"x": x, "index": np.array([9], "int32")},
        extra_inputs=[{"x": x, "index": np.array([3], "int32")}],
    )
    assert result.max_abs_diff <= 1e-5
    np.testing.assert_allclose(result.outputs[0][0], rope_reference(x[0], [9]), atol=1e-5)
    np.testing.assert_allclose(result.outputs[1][0], rope_reference(x[0], [3]), atol=1e-5)
    assert "NEG" not in result.ops


@pytest.mark.parametrize(
    "shape, match",
    [
        ((2, 5, 7), r"even.*\(2, 5, 7\)"),
        ((2, 5), r"rank 3 or 4.*\(2, 5\)"),
        ((1, 2, 3, 4, 6), r"rank 3 or 4"),
    ],
)
def test_rope_bad_shapes(shape, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding()(np.zeros(shape, "float32"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (RotaryEmbedding, {"max_wavelength": 0}, "max_wavelength=0"),
        (RotaryEmbedding, {"scaling_factor": -1.0}, r"scaling_factor=-1\.0"),
        (SinusoidalPositionEncoding, {"max_wavelength": -5}, "max_wavelength=-5"),
        (PositionEmbedding, {"sequence_length": 0}, "sequence_length=0"),
        (PositionEmbedding, {"sequence_length": "8"}, "sequence_length='8'"),
    ],
)
def test_bad_constructor_arguments(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(
    "make", [SinusoidalPositionEncoding, RotaryEmbedding, lambda: PositionEmbedding(4)]
)
def test_negative_start_index(make):
    with pytest.raises(ValueError, match="start_index=-1"):
        make()(np.zeros((1, 2, 4), "float32"), start_index=-1)


@pytest.mark.parametrize("make", [SinusoidalPositionEncoding, lambda: PositionEmbedding(4)])
def test_position_wrong_rank(make):
    with pytest.raises(ValueError, match=r"rank 3.*\(2, 4\)"):
        make()(np.zeros((2, 4), "float32"))
