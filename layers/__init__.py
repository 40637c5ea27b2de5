"""Self-attention layers for Keras 3: `from layers import ...`."""

from layers.attention_2d import SelfAttention2D
from layers.conditional_batch_norm import ConditionalBatchNormalization
from layers.embedding import TokenEmbedding
from layers.multi_head_attention import MultiHeadAttention
from layers.normalization import LayerNorm
from layers.position import (
    PositionEmbedding,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
    TokenAndPositionEmbedding,
)
from layers.self_attention import SelfAttention
from layers.spectral_norm import SNConv2D, SNDense
from layers.transformer import TransformerDecoderBlock, TransformerEncoderBlock

__all__ = [
    "ConditionalBatchNormalization",
    "LayerNorm",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RotaryEmbedding",
    "SNConv2D",
    "SNDense",
    "SelfAttention",
    "SelfAttention2D",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "TokenEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
