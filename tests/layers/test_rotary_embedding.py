"""RotaryEmbedding: RoPE as a complex rotation in NumPy, start_index, TFLite, bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from layers import RotaryEmbedding
from tests.support.harness import run_layer_test, tflite_convert_and_run

RNG = np.random.default_rng(3)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)


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
    "kwargs, match",
    [
        ({"max_wavelength": 0}, "max_wavelength=0"),
        ({"scaling_factor": -1.0}, r"scaling_factor=-1\.0"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)


def test_negative_start_index():
    with pytest.raises(ValueError, match="start_index=-1"):
        RotaryEmbedding()(np.zeros((1, 2, 4), "float32"), start_index=-1)
