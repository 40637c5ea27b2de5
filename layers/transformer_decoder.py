"""Transformer decoder block: causal self-attention, cross-attention and
feed-forward, with static-shape caches for incremental decoding."""

import keras

from layers.transformer_block import TransformerBlockBase
from layers.validation import check_int, check_rank


@keras.saving.register_keras_serializable(package="layers")
class TransformerDecoderBlock(TransformerBlockBase):
    """Transformer decoder block: causal self-attention, cross-attention to
    the encoder outputs, and feed-forward, each with residual, LayerNorm and
    dropout. Supports incremental decoding with static-shape caches.

    Args:
        cross_attention: bool, whether the block attends to encoder outputs
            (`False` gives a decoder-only block).
        cross_length_scale: `None` or int `>= 2`, the cross-attention's
            `length_scale` (`MultiHeadAttention`): the longest trained
            source, beyond which cross-attention grows sharper.
        All other arguments as `TransformerEncoderBlock`; self-attention is
        always causal.

    Call arguments:
        inputs: `[batch, target_length, hidden]`.
        encoder_outputs: `[batch, source_length, hidden]`; needed unless
            `cross_attention_cache` is given.
        decoder_mask: `[batch, target_length]` padding mask of the inputs;
            defaults to their Keras mask.
        encoder_mask: `[batch, source_length]` padding mask of the encoder
            outputs; defaults to their Keras mask.
        self_attention_cache: `[batch, 2, max_length, heads, key_dim]` or the
            rank-4 pair `(key_cache, value_cache)` (see
            `MultiHeadAttention`); with `cache_index`, keys and values of
            `inputs` are written into it.
        cache_index: int or scalar tensor, position of the first input token;
            given exactly when `self_attention_cache` is.
        cross_attention_cache: from `compute_cross_attention_cache`, to avoid
            re-projecting the encoder outputs at every step.
        training: bool.

    Returns:
        `[batch, target_length, hidden]`, or `(output, self_attention_cache)`
        when `self_attention_cache` is given.

    Example:

    >>> import numpy as np
    >>> from layers import TransformerDecoderBlock
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0)
    >>> enc = np.random.rand(1, 4, 8).astype("float32")
    >>> dec = np.random.rand(1, 3, 8).astype("float32")
    >>> full = block(dec, enc)
    >>> cache = np.zeros((1, 2, 3, 2, 4), "float32")
    >>> cross = block.compute_cross_attention_cache(enc)
    >>> step, cache = block(dec[:, :1], self_attention_cache=cache, cache_index=0,
    ...                     cross_attention_cache=cross)
    >>> bool(np.allclose(step, full[:, :1], atol=1e-5))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(self, *args, cross_attention=True, cross_length_scale=None, **kwargs):
        kwargs["causal"] = True
        super().__init__(*args, **kwargs)
        self.cross_attention = bool(cross_attention)
        self.cross_length_scale = check_int(
            "cross_length_scale", cross_length_scale, minimum=2, allow_none=True
        )

    def build(self, inputs_shape, encoder_outputs_shape=None):
        hidden_dim = self._build_self_attention(inputs_shape)
        if self.cross_attention:
            source_shape = encoder_outputs_shape or inputs_shape
            check_rank("encoder_outputs", source_shape)
            self.cross_attention_layer = self._attention(
                hidden_dim, "cross_attention", False, None, False, self.cross_length_scale
            )
            self.cross_attention_layer.build(inputs_shape, source_shape)
            self.cross_attention_norm = self._norm("cross_attention_norm")
            self.cross_attention_norm.build(inputs_shape)
        self._build_feedforward(inputs_shape)
        self.built = True

    def compute_cross_attention_cache(self, encoder_outputs, split=False):
        """Projects the encoder outputs once: `[batch, 2, source_length,
        heads, key_dim]` (or, with `split`, the rank-4 pair `(keys, values)`),
        to pass as `cross_attention_cache` at every step."""
        if not self.built:
            self.build(encoder_outputs.shape, encoder_outputs.shape)
        return self.cross_attention_layer.compute_cache(encoder_outputs, split=split)

    # KerasHub's TransformerDecoder.call convention (a mirror of Keras): masks, caches, training.
    def call(
        self,
        inputs,
        encoder_outputs=None,
        decoder_mask=None,
        encoder_mask=None,
        self_attention_cache=None,
        cache_index=None,
        cross_attention_cache=None,
        training=None,
    ):
        if decoder_mask is None:
            decoder_mask = getattr(inputs, "_keras_mask", None)
        if encoder_mask is None and encoder_outputs is not None:
            encoder_mask = getattr(encoder_outputs, "_keras_mask", None)
        if (self_attention_cache is None) != (cache_index is None):
            given = "None" if self_attention_cache is None else "given"
            raise ValueError(
                "`self_attention_cache` and `cache_index` go together (the cache is written "
                f"at the index). Received: cache_index={cache_index}, self_attention_cache={given}"
            )
        if self.cross_attention and encoder_outputs is None and cross_attention_cache is None:
            raise ValueError(
                "This block has cross-attention: pass `encoder_outputs` or "
                "`cross_attention_cache`. Received: encoder_outputs=None"
            )

        def self_attend(h):
            if self_attention_cache is None:
                return self.self_attention(h, query_mask=decoder_mask, training=training), None
            return self.self_attention(
                h,
                query_mask=decoder_mask,
                cache=self_attention_cache,
                cache_index=cache_index,
                training=training,
            )

        x, new_cache = self._residual(inputs, self.self_attention_norm, self_attend, training)

        if self.cross_attention:

            def cross_attend(h):
                # A cache holds the projected encoder outputs (and comes back).
                cached = cross_attention_cache is not None
                out = self.cross_attention_layer(
                    h,
                    None if cached else encoder_outputs,
                    query_mask=decoder_mask,
                    value_mask=encoder_mask,
                    cache=cross_attention_cache,
                    training=training,
                )
                return (out[0] if cached else out), None

            x, _ = self._residual(x, self.cross_attention_norm, cross_attend, training)
        x = self._feedforward(x, training)
        if self_attention_cache is not None:
            return x, new_cache
        return x

    def compute_output_spec(
        self, inputs, encoder_outputs=None, self_attention_cache=None, **kwargs
    ):
        out = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if self_attention_cache is None:
            return out
        cache = keras.tree.map_structure(
            lambda c: keras.KerasTensor(c.shape, dtype=c.dtype), self_attention_cache
        )
        return out, cache

    def get_config(self):
        config = super().get_config()
        config.pop("causal")
        config["cross_attention"] = self.cross_attention
        config["cross_length_scale"] = self.cross_length_scale
        return config
