"""What the Transformer encoder and decoder blocks share: arguments, the
feed-forward network and the residual wiring."""

import keras

from layers import attention_ops
from layers.layer_norm import LayerNorm
from layers.multi_head_attention import MultiHeadAttention
from layers.validation import (
    check_activation,
    check_choice,
    check_chunk_size,
    check_int,
    check_positive_number,
    check_rank,
    check_rate,
)


class TransformerBlockBase(keras.layers.Layer):
    """Argument handling and the feed-forward/residual parts both blocks share.

    Not a layer to use on its own (and not registered): `TransformerEncoderBlock`
    and `TransformerDecoderBlock` build their attention on top of it.
    """

    # KerasHub's TransformerEncoder/Decoder signature and Keras-style checks (a mirror of Keras).
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
        self.chunk_size = check_chunk_size(chunk_size)
        self.intermediate_dim = check_int("intermediate_dim", intermediate_dim)
        self.key_dim = check_int("key_dim", key_dim, allow_none=True)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate(
            "attention_dropout", self.dropout if attention_dropout is None else attention_dropout
        )
        self.norm_first = bool(norm_first)
        self.activation = check_activation("activation", activation)
        self.window = check_int("window", window, minimum=0, allow_none=True)
        self.causal = bool(causal)
        self.rotary = bool(rotary)
        self.include_self = bool(include_self)
        self.score = check_choice("score", score, attention_ops.SCORES)
        self.normalize = check_choice("normalize", normalize, attention_ops.NORMALIZATIONS)
        self.layer_norm_epsilon = float(
            check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def _attention(self, hidden_dim, name, causal, window, rotary, length_scale=None):
        if self.key_dim is None and hidden_dim % self.num_heads:
            raise ValueError(
                "`num_heads` must divide the hidden size when `key_dim` is not "
                f"given. Received: num_heads={self.num_heads}, hidden size={hidden_dim}"
            )
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or hidden_dim // self.num_heads,
            output_dim=hidden_dim,
            score=self.score,
            normalize=self.normalize,
            include_self=self.include_self,
            window=window,
            causal=causal,
            dropout=self.attention_dropout,
            rotary=rotary,
            chunk_size=self.chunk_size,
            length_scale=length_scale,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name=name,
        )

    def _initializer(self):
        return attention_ops.clone_initializer(self.kernel_initializer)

    def _norm(self, name):
        return LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

    def _build_self_attention(self, inputs_shape):
        """The self-attention and its norm; returns the hidden size."""
        check_rank("inputs", inputs_shape)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(
            hidden_dim, "self_attention", self.causal, self.window, self.rotary
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(inputs_shape)
        return hidden_dim

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
