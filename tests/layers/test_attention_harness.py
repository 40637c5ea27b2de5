"""The shared layer test applied to the attention layers and blocks."""

import numpy as np
import pytest

from layers import (
    MultiHeadAttention,
    SelfAttention,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)
from tests.support.harness import run_layer_test

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

RNG = np.random.default_rng(5)
X = RNG.normal(size=(2, 6, 8)).astype("float32")
SOURCE = RNG.normal(size=(2, 4, 6)).astype("float32")
MASK = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(score="dot", normalize="relu", window=2),
        dict(score="additive", include_self=False),
        dict(causal=True, use_bias=True),
    ],
    ids=["default", "dot-relu-window", "additive-noself", "causal"],
)
def test_self_attention(options):
    run_layer_test(
        SelfAttention,
        dict(units=4, value_units=5, **options),
        X,
        expected_output_shape=(2, 6, 5),
        input_mask=MASK,
        supports_masking=True,
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(causal=True, window=3),
        dict(rotary=True),
        dict(score="additive", normalize="relu"),
        dict(causal=True, length_scale=2),
    ],
    ids=["default", "causal-window", "rotary", "additive-relu", "causal-length-scale"],
)
def test_multi_head_self_attention(options):
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, **options),
        X,
        expected_output_shape=(2, 6, 8),
        input_mask=MASK,
        supports_masking=True,
    )


def test_multi_head_cross_attention_with_scores():
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, output_dim=3),
        {"query": X, "value": SOURCE},
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=[(2, 6, 3), (2, 2, 6, 4)],
    )


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_block(norm_first):
    run_layer_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16, dropout=0.1, norm_first=norm_first),
        X,
        expected_output_shape=(2, 6, 8),
        input_mask=MASK,
        supports_masking=True,
    )


@pytest.mark.parametrize("options", [dict(), dict(cross_length_scale=2)])
def test_decoder_block(options):
    run_layer_test(
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=16, dropout=0.1, **options),
        {"inputs": X, "encoder_outputs": RNG.normal(size=(2, 4, 8)).astype("float32")},
        expected_output_shape=(2, 6, 8),
    )


def test_encoder_block_returning_scores():
    run_layer_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16, window=1),
        X,
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=[(2, 6, 8), (2, 2, 6, 6)],
    )


def test_self_attention_returning_scores():
    run_layer_test(
        SelfAttention,
        dict(units=4, causal=True),
        X,
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=[(2, 6, 4), (2, 6, 6)],
    )
