"""TransformerEncoderBlock: against a Keras composition, masks and bad input."""

import keras
import numpy as np
import pytest

from layers import TransformerEncoderBlock

RNG = np.random.default_rng(11)


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _keras_reference(block, x, norm_first):
    """The same block recomputed from keras.layers with the weights copied."""
    mha = keras.layers.MultiHeadAttention(
        num_heads=block.num_heads, key_dim=block.self_attention.key_dim
    )
    mha(x, x)
    for name in ("query", "key", "value", "output"):
        getattr(mha, f"_{name}_dense").set_weights(
            getattr(block.self_attention, f"{name}_dense").get_weights()
        )
    n1 = [np.asarray(w) for w in block.self_attention_norm.get_weights()]
    n2 = [np.asarray(w) for w in block.feedforward_norm.get_weights()]
    w1, b1 = [np.asarray(w) for w in block.feedforward_intermediate.get_weights()]
    w2, b2 = [np.asarray(w) for w in block.feedforward_output.get_weights()]
    ln = lambda v, p: _layer_norm(v, p[0], p[1], block.layer_norm_epsilon)
    ffn = lambda v: np.asarray(keras.activations.gelu(v @ w1 + b1)) @ w2 + b2
    if norm_first:
        h = ln(x, n1)
        h = x + np.asarray(mha(h, h))
        return h + ffn(ln(h, n2))
    h = ln(x + np.asarray(mha(x, x)), n1)
    return ln(h + ffn(h), n2)


@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_block_matches_keras_composition(norm_first):
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    block = TransformerEncoderBlock(
        num_heads=2, intermediate_dim=16, dropout=0.0, norm_first=norm_first
    )
    out = np.asarray(block(x))
    np.testing.assert_allclose(out, _keras_reference(block, x, norm_first), atol=1e-4)


def test_encoder_block_mask_propagates_and_protects_real_tokens():
    ids = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(20, 8, mask_zero=True)(ids)
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0)
    model = keras.Model(ids, block(emb))
    a = np.array([[3, 4, 5, 0, 0]])
    b = np.array([[3, 4, 5, 7, 9]])
    padded = np.asarray(model(a))[:, :3]
    alone = np.asarray(model(a[:, :3]))
    np.testing.assert_allclose(padded, alone, atol=1e-5)
    assert not np.allclose(np.asarray(model(b))[:, :3], alone, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,call,pattern",
    [
        (
            dict(num_heads=3, intermediate_dim=8),
            (2, 4, 8),
            r"num_heads=3, hidden size=8",
        ),
        (
            dict(num_heads=2, intermediate_dim=0),
            None,
            r"intermediate_dim=0",
        ),
        (
            dict(num_heads=2, intermediate_dim=8, window=-1),
            None,
            r"window=-1",
        ),
        (
            dict(num_heads=2, intermediate_dim=8, score="x"),
            None,
            r"score='x'",
        ),
        (
            dict(num_heads=2, intermediate_dim=8),
            (2, 8),
            r"inputs\.shape=\(2, 8\)",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_it(kwargs, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        layer = TransformerEncoderBlock(**kwargs)
        if call is not None:
            layer(np.zeros(call, "float32"))
