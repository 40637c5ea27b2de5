"""Self-attention layers for Keras 3: `from layers import ...`."""

from layers.conditional_batch_norm import ConditionalBatchNormalization
from layers.layer_norm import LayerNorm
from layers.multi_head_attention import MultiHeadAttention
from layers.position_embedding import PositionEmbedding
from layers.rotary_embedding import RotaryEmbedding
from layers.self_attention import SelfAttention
from layers.self_attention_2d import SelfAttention2D
from layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from layers.spectral_norm import SNConv2D, SNDense
from layers.token_and_position_embedding import TokenAndPositionEmbedding
from layers.token_embedding import TokenEmbedding
from layers.transformer_decoder import TransformerDecoderBlock
from layers.transformer_encoder import TransformerEncoderBlock

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
