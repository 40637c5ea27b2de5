"""Transformer encoder and decoder blocks built from this package's layers."""

import keras

from layers import attention_ops
from layers.multi_head_attention import MultiHeadAttention
from layers.normalization import LayerNorm
from layers.validation import check_choice, check_int, check_rank, check_rate


class _BlockBase(keras.layers.Layer):
    """Argument handling and the feed-forward/residual parts both blocks share."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        dropout=0.1,
        attention_dropout=None,
        norm_first=True,
        activation="gelu",
        window=None,
        causal=False,
        rotary=False,
        include_self=True,
        score="scaled_dot",
        normalize="softmax",
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        chunk_size=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_int("num_heads", num_heads)
        self.chunk_size = attention_ops.check_chunk_size(chunk_size)
        self.intermediate_dim = check_int("intermediate_dim", intermediate_dim)
        self.key_dim = check_int("key_dim", key_dim, allow_none=True)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate(
            "attention_dropout", self.dropout if attention_dropout is None else attention_dropout
        )
        self.norm_first = bool(norm_first)
        try:
            self.activation = keras.activations.get(activation)
        except ValueError:
            raise ValueError(
                "`activation` must be a Keras activation name or callable. "
                f"Received: activation={activation!r}"
            ) from None
        self.window = check_int("window", window, minimum=0, allow_none=True)
        self.causal = bool(causal)
        self.rotary = bool(rotary)
        self.include_self = bool(include_self)
        self.score = check_choice("score", score, attention_ops.SCORES)
        self.normalize = check_choice("normalize", normalize, attention_ops.NORMALIZATIONS)
        if not isinstance(layer_norm_epsilon, (int, float)) or layer_norm_epsilon <= 0:
            raise ValueError(
                "`layer_norm_epsilon` must be a positive float. "
                f"Received: layer_norm_epsilon={layer_norm_epsilon!r}"
            )
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def _head_dim(self, hidden_dim):
        if self.key_dim is not None:
            return self.key_dim
        if hidden_dim % self.num_heads:
            raise ValueError(
                "`num_heads` must divide the hidden size when `key_dim` is not "
                f"given. Received: num_heads={self.num_heads}, hidden size={hidden_dim}"
            )
        return hidden_dim // self.num_heads

    def _attention(self, hidden_dim, name, causal, window, rotary):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._head_dim(hidden_dim),
            output_dim=hidden_dim,
            score=self.score,
            normalize=self.normalize,
            include_self=self.include_self,
            window=window,
            causal=causal,
            dropout=self.attention_dropout,
            rotary=rotary,
            chunk_size=self.chunk_size,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name=name,
        )

    def _initializer(self):
        return self.kernel_initializer.__class__.from_config(self.kernel_initializer.get_config())

    def _norm(self, name):
        return LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

    def _build_feedforward(self, shape):
        hidden_dim = shape[-1]
        self.feedforward_norm = self._norm("feedforward_norm")
        self.feedforward_norm.build(shape)
        self.feedforward_intermediate = keras.layers.Dense(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="feedforward_intermediate",
        )
        self.feedforward_intermediate.build(shape)
        self.feedforward_output = keras.layers.Dense(
            hidden_dim,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="feedforward_output",
        )
        self.feedforward_output.build((*shape[:-1], self.intermediate_dim))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _residual(self, x, norm, sublayer, training):
        """Pre-LN: x + f(norm(x)); post-LN: norm(x + f(x)). `sublayer` returns
        the output tensor and any extras (scores, caches)."""
        inner = norm(x) if self.norm_first else x
        out, extras = sublayer(inner)
        out = x + self.dropout_layer(out, training=training)
        if not self.norm_first:
            out = norm(out)
        return out, extras

    def _feedforward(self, x, training):
        def ffn(h):
            h = self.feedforward_intermediate(h)
            h = self.dropout_layer(h, training=training)
            return self.feedforward_output(h), ()

        return self._residual(x, self.feedforward_norm, ffn, training)[0]

    def compute_mask(self, inputs, mask=None, **kwargs):
        return mask

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first,
                "activation": keras.activations.serialize(self.activation),
                "window": self.window,
                "causal": self.causal,
                "rotary": self.rotary,
                "include_self": self.include_self,
                "score": self.score,
                "normalize": self.normalize,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "chunk_size": self.chunk_size,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="layers")
class TransformerEncoderBlock(attention_ops.ScoresOutputSpec, _BlockBase):
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
        check_rank("inputs", inputs_shape, 3)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(
            hidden_dim, "self_attention", self.causal, self.window, self.rotary
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(inputs_shape)
        self._build_feedforward(inputs_shape)
        self.built = True

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


@keras.saving.register_keras_serializable(package="layers")
class TransformerDecoderBlock(_BlockBase):
    """Transformer decoder block: causal self-attention, cross-attention to
    the encoder outputs, and feed-forward, each with residual, LayerNorm and
    dropout. Supports incremental decoding with static-shape caches.

    Args:
        cross_attention: bool, whether the block attends to encoder outputs
            (`False` gives a decoder-only block).
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
        cache_index: int or scalar tensor, position of the first input token.
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

    def __init__(self, *args, cross_attention=True, **kwargs):
        kwargs["causal"] = True
        super().__init__(*args, **kwargs)
        self.cross_attention = bool(cross_attention)

    def build(self, inputs_shape, encoder_outputs_shape=None):
        check_rank("inputs", inputs_shape, 3)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(
            hidden_dim, "self_attention", True, self.window, self.rotary
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(inputs_shape)
        if self.cross_attention:
            source_shape = encoder_outputs_shape or inputs_shape
            check_rank("encoder_outputs", source_shape, 3)
            self.cross_attention_layer = self._attention(
                hidden_dim, "cross_attention", False, None, False
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
        if self_attention_cache is not None and cache_index is None:
            raise ValueError(
                "`cache_index` is required with `self_attention_cache`. Received: cache_index=None"
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
                if cross_attention_cache is not None:
                    out, _ = self.cross_attention_layer(
                        h,
                        query_mask=decoder_mask,
                        value_mask=encoder_mask,
                        cache=cross_attention_cache,
                        training=training,
                    )
                else:
                    out = self.cross_attention_layer(
                        h,
                        encoder_outputs,
                        query_mask=decoder_mask,
                        value_mask=encoder_mask,
                        training=training,
                    )
                return out, None

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
        return config
