"""Self-attention layers for Keras 3: `from layers import ...`."""

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
from layers.transformer import TransformerDecoderBlock, TransformerEncoderBlock
