"""Transformer blocks: reference math, caches, masks and bad input."""

import keras
import numpy as np
import pytest

from layers import TransformerDecoderBlock, TransformerEncoderBlock

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
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("rotary", [False, True])
def test_decoder_cache_equals_full_recomputation(norm_first, rotary):
    block = TransformerDecoderBlock(
        num_heads=2, intermediate_dim=16, dropout=0.0, norm_first=norm_first, rotary=rotary
    )
    enc = RNG.normal(size=(2, 6, 8)).astype("float32")
    enc_mask = np.array([[1] * 6, [1] * 3 + [0] * 3], bool)
    dec = RNG.normal(size=(2, 7, 8)).astype("float32")
    full = np.asarray(block(dec, enc, encoder_mask=enc_mask))
    cache = np.zeros((2, 2, 7, 2, 4), "float32")
    cross = block.compute_cross_attention_cache(enc)
    # The rank-4 split form (what GPU exports use) must agree as well.
    split = (np.zeros((2, 7, 2, 4), "float32"), np.zeros((2, 7, 2, 4), "float32"))
    split_cross = block.compute_cross_attention_cache(enc, split=True)
    for i in range(7):
        y, cache = block(
            dec[:, i : i + 1],
            self_attention_cache=cache,
            cache_index=i,
            cross_attention_cache=cross,
            encoder_mask=enc_mask,
        )
        np.testing.assert_allclose(np.asarray(y), full[:, i : i + 1], atol=1e-5)
        y, split = block(
            dec[:, i : i + 1],
            self_attention_cache=split,
            cache_index=i,
            cross_attention_cache=split_cross,
            encoder_mask=enc_mask,
        )
        np.testing.assert_allclose(np.asarray(y), full[:, i : i + 1], atol=1e-5)
    np.testing.assert_allclose(np.asarray(split[1]), np.asarray(cache)[:, 1], atol=1e-6)


@pytest.mark.slow
def test_decoder_is_causal_and_uses_the_encoder():
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0)
    enc = RNG.normal(size=(1, 4, 8)).astype("float32")
    dec = RNG.normal(size=(1, 5, 8)).astype("float32")
    base = np.asarray(block(dec, enc))
    later = dec.copy()
    later[:, 3:] += 5.0
    np.testing.assert_allclose(np.asarray(block(later, enc))[:, :3], base[:, :3], atol=1e-5)
    assert not np.allclose(np.asarray(block(dec, enc + 1.0)), base, atol=1e-4)


@pytest.mark.slow
def test_decoder_only_block():
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16, cross_attention=False)
    assert tuple(block(np.zeros((1, 3, 8), "float32")).shape) == (1, 3, 8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls,kwargs,call,pattern",
    [
        (
            TransformerEncoderBlock,
            dict(num_heads=3, intermediate_dim=8),
            (2, 4, 8),
            r"num_heads=3, hidden size=8",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=0),
            None,
            r"intermediate_dim=0",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=8, window=-1),
            None,
            r"window=-1",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=8, score="x"),
            None,
            r"score='x'",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=8),
            (2, 8),
            r"inputs\.shape=\(2, 8\)",
        ),
        (
            TransformerDecoderBlock,
            dict(num_heads=2, intermediate_dim=8, layer_norm_epsilon=0),
            None,
            r"layer_norm_epsilon=0",
        ),
        (
            TransformerDecoderBlock,
            dict(num_heads=2, intermediate_dim=8),
            (2, 4, 8),
            r"encoder_outputs=None",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_it(cls, kwargs, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        layer = cls(**kwargs)
        if call is not None:
            layer(np.zeros(call, "float32"))
