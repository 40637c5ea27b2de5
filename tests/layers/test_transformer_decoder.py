"""TransformerDecoderBlock: caches against full recomputation, causality, bad input."""

import numpy as np
import pytest

from layers import TransformerDecoderBlock

RNG = np.random.default_rng(11)


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
    "kwargs,call,pattern",
    [
        (
            dict(num_heads=2, intermediate_dim=8, layer_norm_epsilon=0),
            None,
            r"layer_norm_epsilon=0",
        ),
        (
            dict(num_heads=2, intermediate_dim=8),
            (2, 4, 8),
            r"encoder_outputs=None",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_it(kwargs, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        layer = TransformerDecoderBlock(**kwargs)
        if call is not None:
            layer(np.zeros(call, "float32"))


def test_self_attention_cache_and_cache_index_come_together():
    # Either alone would be ignored or unusable: both are refused, naming the values.
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=8, cross_attention=False)
    x = np.zeros((1, 3, 8), "float32")
    cache = np.zeros((1, 2, 3, 2, 4), "float32")
    with pytest.raises(ValueError, match="cache_index=None, self_attention_cache=given"):
        block(x, self_attention_cache=cache)
    with pytest.raises(ValueError, match="cache_index=1, self_attention_cache=None"):
        block(x, cache_index=1)
