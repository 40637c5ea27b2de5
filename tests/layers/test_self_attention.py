"""SelfAttention against the NumPy formulas of the lecture."""

import itertools

import numpy as np
import pytest

from layers import SelfAttention
from tests.support.attention_reference import allowed_matrix, single_head

RNG = np.random.default_rng(7)


def _weights(layer):
    get = lambda d: [np.asarray(x) for x in d.get_weights()]
    wq, wk, wv = (get(d)[0] for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    biases = {}
    if layer.use_bias:
        biases = dict(
            bq=get(layer.query_dense)[1], bk=get(layer.key_dense)[1], bv=get(layer.value_dense)[1]
        )
    w = np.asarray(layer.score_vector) if layer.score == "additive" else None
    return wq, wk, wv, w, biases


@pytest.mark.parametrize(
    "score,normalize",
    list(itertools.product(["dot", "scaled_dot", "additive"], ["softmax", "relu"])),
)
def test_matches_numpy_formulas(score, normalize):
    x = RNG.normal(size=(2, 6, 5)).astype("float32")
    layer = SelfAttention(units=4, value_units=3, score=score, normalize=normalize, use_bias=True)
    out, alpha = layer(x, return_attention_scores=True)
    wq, wk, wv, w, biases = _weights(layer)
    for b in range(2):
        ref_out, ref_alpha = single_head(
            x[b], wq, wk, wv, score=score, w=w, normalize=normalize, **biases
        )
        np.testing.assert_allclose(np.asarray(alpha[b]), ref_alpha, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out[b]), ref_out, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(window=1),
        dict(window=0),
        dict(causal=True),
        dict(include_self=False),
        dict(causal=True, window=2, include_self=False),
    ],
)
@pytest.mark.parametrize("normalize", ["softmax", "relu"])
def test_structural_masks_and_padding(options, normalize):
    x = RNG.normal(size=(2, 7, 5)).astype("float32")
    padding = np.array([[1] * 7, [1] * 4 + [0] * 3], bool)
    layer = SelfAttention(units=4, normalize=normalize, **options)
    out, alpha = layer(x, mask=padding, return_attention_scores=True)
    wq, wk, wv, w, _ = _weights(layer)
    for b in range(2):
        allowed = allowed_matrix(7, 7, query_mask=padding[b], key_mask=padding[b], **options)
        ref_out, ref_alpha = single_head(x[b], wq, wk, wv, normalize=normalize, allowed=allowed)
        np.testing.assert_allclose(np.asarray(alpha[b]), ref_alpha, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out[b]), ref_out, atol=1e-5)


def test_explicit_attention_mask_and_fully_masked_rows_are_zero():
    x = RNG.normal(size=(1, 4, 3)).astype("float32")
    attention_mask = np.ones((1, 4, 4), bool)
    attention_mask[0, 2, :] = False  # query 2 may look at nothing
    attention_mask[0, 0, 3] = False
    layer = SelfAttention(units=2, use_bias=True)
    out, alpha = layer(x, attention_mask=attention_mask, return_attention_scores=True)
    wq, wk, wv, w, biases = _weights(layer)
    ref_out, ref_alpha = single_head(x[0], wq, wk, wv, allowed=attention_mask[0], **biases)
    np.testing.assert_allclose(np.asarray(out[0]), ref_out, atol=1e-5)
    np.testing.assert_allclose(np.asarray(alpha[0]), ref_alpha, atol=1e-5)
    assert np.all(np.asarray(out[0, 2]) == 0.0)


def test_dropout_only_in_training():
    x = RNG.normal(size=(2, 5, 3)).astype("float32")
    layer = SelfAttention(units=4, dropout=0.5, seed=1)
    inference = np.asarray(layer(x, training=False))
    np.testing.assert_allclose(inference, np.asarray(layer(x, training=False)))
    assert not np.allclose(inference, np.asarray(layer(x, training=True)))


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(units=0), "units"),
        (dict(units=4, score="cosine"), "score"),
        (dict(units=4, normalize="sigmoid"), "normalize"),
        (dict(units=4, window=-1), "window"),
        (dict(units=4, dropout=1.5), "dropout"),
        (dict(units=4, value_units=-2), "value_units"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}=") as info:
        SelfAttention(**kwargs)
    assert repr(kwargs[name]) in str(info.value) or str(kwargs[name]) in str(info.value)


def test_wrong_rank_names_the_input():
    with pytest.raises(ValueError, match=r"inputs\.shape=\(2, 5\)"):
        SelfAttention(units=4)(np.zeros((2, 5), "float32"))
