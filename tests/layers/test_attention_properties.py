"""Properties every attention layer must have, checked with hypothesis."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layers import MultiHeadAttention, SelfAttention, TransformerEncoderBlock

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

LENGTH = 8
FEATURES = 6


def _layers(**options):
    return [
        SelfAttention(units=4, **options),
        MultiHeadAttention(num_heads=2, key_dim=3, **options),
        TransformerEncoderBlock(num_heads=2, intermediate_dim=8, dropout=0.0, **options),
    ]


PLAIN = _layers()
CAUSAL = _layers(causal=True)
WINDOW = {w: _layers(window=w) for w in (0, 1, 2)}

sequences = st.integers(0, 2**31 - 1).map(
    lambda seed: np.random.default_rng(seed).normal(size=(2, LENGTH, FEATURES)).astype("float32")
)


def _out(layer, x, **kwargs):
    return np.asarray(layer(x, **kwargs))


@pytest.mark.parametrize("index", range(3))
@given(x=sequences, perm_seed=st.integers(0, 1000))
def test_permutation_equivariant_without_positions(index, x, perm_seed):
    layer = PLAIN[index]
    perm = np.random.default_rng(perm_seed).permutation(LENGTH)
    np.testing.assert_allclose(_out(layer, x[:, perm]), _out(layer, x)[:, perm], atol=1e-4)


@pytest.mark.parametrize("index", range(3))
@given(x=sequences, cut=st.integers(0, LENGTH - 1), noise_seed=st.integers(0, 1000))
def test_causal_output_ignores_the_future(index, x, cut, noise_seed):
    layer = CAUSAL[index]
    changed = x.copy()
    changed[:, cut + 1 :] = np.random.default_rng(noise_seed).normal(
        size=changed[:, cut + 1 :].shape
    )
    np.testing.assert_allclose(
        _out(layer, changed)[:, : cut + 1], _out(layer, x)[:, : cut + 1], atol=1e-5
    )


@pytest.mark.parametrize("index", range(3))
@given(x=sequences, valid=st.integers(1, LENGTH), noise_seed=st.integers(0, 1000))
def test_padding_never_changes_real_positions(index, x, valid, noise_seed):
    layer = PLAIN[index]
    mask = np.zeros((2, LENGTH), bool)
    mask[:, :valid] = True
    changed = x.copy()
    changed[:, valid:] = (
        np.random.default_rng(noise_seed).normal(size=changed[:, valid:].shape) * 10
    )
    kwargs = {"query_mask": mask} if index == 1 else {"mask": mask}
    np.testing.assert_allclose(
        _out(layer, changed, **kwargs)[:, :valid], _out(layer, x, **kwargs)[:, :valid], atol=1e-5
    )


@pytest.mark.parametrize("index", range(3))
@given(
    x=sequences,
    window=st.sampled_from([0, 1, 2]),
    position=st.integers(0, LENGTH - 1),
    noise_seed=st.integers(0, 1000),
)
def test_window_never_sees_beyond(index, x, window, position, noise_seed):
    layer = WINDOW[window][index]
    far = [j for j in range(LENGTH) if abs(j - position) > window]
    changed = x.copy()
    changed[:, far] = np.random.default_rng(noise_seed).normal(size=changed[:, far].shape) * 10
    np.testing.assert_allclose(
        _out(layer, changed)[:, position], _out(layer, x)[:, position], atol=1e-5
    )
    if far:  # the property is not vacuous: a token beyond the window exists
        assert not np.allclose(changed[:, far], x[:, far])
