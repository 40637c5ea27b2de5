"""Transformer encoder block: self-attention and feed-forward."""

import keras

from layers.scores_output_spec import ScoresOutputSpec
from layers.transformer_block import TransformerBlockBase


@keras.saving.register_keras_serializable(package="layers")
class TransformerEncoderBlock(ScoresOutputSpec, TransformerBlockBase):
    """Transformer encoder block: self-attention and feed-forward, each with a
    residual connection, LayerNorm and dropout.

    With `norm_first=True` (default, pre-LN) each sub-layer computes
    `x + f(LayerNorm(x))`, which trains without warm-up tricks; with
    `norm_first=False` it is the original post-LN `LayerNorm(x + f(x))`. The
    LayerNorm is this package's `LayerNorm`, which converts to TFLite ops the
    mobile GPU delegate and integer quantization accept.

    Args:
        num_heads: int, number of attention heads.
        intermediate_dim: int, hidden size of the feed-forward network.
        key_dim: int, size of each head. Defaults to `hidden // num_heads`,
            in which case `num_heads` must divide the hidden size.
        dropout: float, dropout after each sub-layer and in the feed-forward.
        attention_dropout: float, dropout on attention weights; defaults to
            `dropout`.
        norm_first: bool, pre-LN (`True`) or post-LN (`False`).
        activation: activation of the feed-forward network.
        window: `None` or int, local attention window `|i - j| <= window`.
        causal: bool, causal self-attention.
        rotary: bool, rotary position embeddings in the attention.
        include_self: bool, whether a token may attend to itself.
        score: `"scaled_dot"`, `"dot"` or `"additive"`.
        normalize: `"softmax"` or `"relu"`.
        layer_norm_epsilon: float, LayerNorm epsilon.
        kernel_initializer: initializer of all kernels.
        chunk_size: `None`, `"auto"` or int, block-wise attention in memory
            linear in the length (see `MultiHeadAttention`).
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `[batch, length, hidden]`.
        mask: `[batch, length]` padding mask; defaults to the Keras mask.
        attention_mask: boolean `[batch, length, length]`.
        return_attention_scores: bool, also return `[batch, heads, length,
            length]` weights.
        training: bool.

    Returns:
        `[batch, length, hidden]` (and the weights if requested).

    Example:

    >>> import numpy as np
    >>> from layers import TransformerEncoderBlock
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    >>> tuple(block(np.random.rand(2, 5, 8).astype("float32")).shape)
    (2, 5, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745) (pre-LN)
    """

    def build(self, inputs_shape):
        self._build_self_attention(inputs_shape)
        self._build_feedforward(inputs_shape)
        self.built = True

    # Keras's call convention (a mirror of Keras): inputs, mask, the options, training last.
    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        def attend(h):
            result = self.self_attention(
                h,
                query_mask=mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return result if return_attention_scores else (result, None)

        x, scores = self._residual(inputs, self.self_attention_norm, attend, training)
        x = self._feedforward(x, training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, inputs_shape, return_attention_scores=False):
        if not return_attention_scores:
            return inputs_shape
        batch, length = inputs_shape[0], inputs_shape[1]
        return inputs_shape, (batch, self.num_heads, length, length)
