"""SinusoidalPositionEncoding: the paper formula in NumPy, start_index, bad input."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from layers import SinusoidalPositionEncoding
from tests.support.harness import run_layer_test

RNG = np.random.default_rng(3)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)


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


@pytest.mark.slow
def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="max_wavelength=-5"):
        SinusoidalPositionEncoding(max_wavelength=-5)


def test_negative_start_index():
    with pytest.raises(ValueError, match="start_index=-1"):
        SinusoidalPositionEncoding()(np.zeros((1, 2, 4), "float32"), start_index=-1)


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"rank 3.*\(2, 4\)"):
        SinusoidalPositionEncoding()(np.zeros((2, 4), "float32"))


def paper_formula_at(positions, dim, base=10000.0):
    """The paper's PE at arbitrary (per-example, possibly fractional) positions."""
    positions = np.asarray(positions, "float64")
    out = np.zeros(positions.shape + (dim,))
    for j in range(dim):
        angle = positions / base ** (2 * (j // 2) / dim)
        out[..., j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return out


@pytest.mark.parametrize("dim", [8, 5])
def test_explicit_positions_match_paper_formula_per_example(dim):
    positions = np.array([[0, 3, 17, 200], [0, 1, 2, 3.5]], "float32")
    x = np.zeros((2, 4, dim), "float32")
    out = np.asarray(SinusoidalPositionEncoding()(x, positions=positions))
    np.testing.assert_allclose(out, paper_formula_at(positions, dim), atol=1e-4)
    # Integer positions work too, and 0, 1, 2, ... is the default encoding.
    counted = np.asarray(SinusoidalPositionEncoding()(x, positions=np.tile(np.arange(4), (2, 1))))
    np.testing.assert_allclose(counted, np.asarray(SinusoidalPositionEncoding()(x)), atol=1e-6)


def test_encode_positions_any_shape():
    positions = np.array([[[0.0, 9.0]], [[4.0, 1.0]]], "float32")  # [2, 1, 2]
    out = np.asarray(SinusoidalPositionEncoding(max_wavelength=100).encode_positions(positions, 6))
    assert out.shape == (2, 1, 2, 6)
    np.testing.assert_allclose(out, paper_formula_at(positions, 6, 100.0), atol=1e-5)


def test_positions_of_wrong_rank():
    with pytest.raises(ValueError, match=r"positions.shape=\(4,\)"):
        SinusoidalPositionEncoding()(np.zeros((1, 4, 4), "float32"), positions=np.arange(4))
