"""Self-attention layers for Keras 3: `from layers import ...`."""

from layers.multi_head_attention import MultiHeadAttention
from layers.self_attention import SelfAttention
from layers.transformer import TransformerDecoderBlock, TransformerEncoderBlock
