"""Single-head self-attention exactly as taught."""

import math

import keras
from keras import ops

from layers import attention_ops
from layers.attention_paths import attend
from layers.chunked_attention import resolve_chunk_size
from layers.masks import Visibility
from layers.scores_output_spec import ScoresOutputSpec
from layers.validation import (
    check_choice,
    check_chunk_size,
    check_int,
    check_rank,
    check_rate,
    check_shape,
    known_shape,
)


@keras.saving.register_keras_serializable(package="layers")
class SelfAttention(ScoresOutputSpec, keras.layers.Layer):
    """Single-head self-attention, the layer of the lecture.

    For input vectors `a^1 .. a^T` it computes `q^i = W^q a^i`,
    `k^i = W^k a^i`, `v^i = W^v a^i`, the relevance of every key to every
    query `alpha_{i,j} = q^i . k^j`, normalises each row to `alpha'_{i,j}` and
    outputs `b^i = sum_j alpha'_{i,j} v^j`. In matrix form: `Q = W^q I`,
    `K = W^k I`, `V = W^v I`, `A = K^T Q`, `A' = softmax(A)`, `O = V A'`.
    Only `W^q`, `W^k`, `W^v` (and, for additive scoring, `w`) are learned;
    there is no output projection.

    Args:
        units: int, size of the queries and keys.
        value_units: int, size of the values and of the output. Defaults to
            `units`.
        score: `"scaled_dot"` (`q.k / sqrt(units)`, default), `"dot"` (`q.k`)
            or `"additive"` (`w^T tanh(q + k)`, Bahdanau; `W^q`, `W^k` play
            the roles of `W1`, `W2`).
        normalize: `"softmax"` (default) or `"relu"` (`alpha' = relu(alpha)`,
            which the lecture notes report works about as well).
        include_self: bool, whether a query may attend to its own key.
        window: `None` or int `>= 0`: attend only to `|i - j| <= window`.
        causal: bool, attend only to `j <= i`.
        dropout: float in `[0, 1)`, dropout on the attention weights.
        use_bias: bool, biases in the projections (the formulas have none).
        chunk_size: `None`, `"auto"` or int: compute block by block with an
            online softmax, in memory linear in the length, gradients
            included (see `MultiHeadAttention`, also for `"auto"`); an int
            cannot be combined with `return_attention_scores`.
        kernel_initializer: initializer of `W^q`, `W^k`, `W^v`.
        seed: optional int, seed of the dropout.
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `[batch, length, features]`.
        mask: `[batch, length]` padding mask; defaults to the Keras mask of
            `inputs`. Padded positions are never attended to, and their own
            output is zero.
        attention_mask: boolean `[batch, length, length]`, `True` where `i`
            may attend to `j`.
        return_attention_scores: bool, also return `alpha'` as
            `[batch, length, length]`.
        training: bool, dropout is active only when training.

    Returns:
        `[batch, length, value_units]`, and the weights if requested. A query
        that may attend to nothing (all keys masked) outputs zeros.

    Example:

    >>> import numpy as np
    >>> from layers import SelfAttention
    >>> layer = SelfAttention(units=4, window=1)
    >>> x = np.random.rand(2, 6, 3).astype("float32")
    >>> b, alpha = layer(x, return_attention_scores=True)
    >>> tuple(b.shape), float(alpha[0, 0, 3])
    ((2, 6, 4), 0.0)

    References:
        - Hung-yi Lee, Machine Learning lectures, "Self-attention".
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Bahdanau et al., 2015](https://arxiv.org/abs/1409.0473)
    """

    # MultiHeadAttention's options for one head: Keras's signature and checks (a mirror of Keras).
    def __init__(
        self,
        units,
        value_units=None,
        score="scaled_dot",
        normalize="softmax",
        include_self=True,
        window=None,
        causal=False,
        dropout=0.0,
        use_bias=False,
        chunk_size=None,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_int("units", units)
        self.value_units = check_int("value_units", value_units, allow_none=True) or self.units
        self.score = check_choice("score", score, attention_ops.SCORES)
        self.normalize = check_choice("normalize", normalize, attention_ops.NORMALIZATIONS)
        self.include_self = bool(include_self)
        self.window = check_int("window", window, minimum=0, allow_none=True)
        self.causal = bool(causal)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.chunk_size = check_chunk_size(chunk_size)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.supports_masking = True
        self._dropout_layer = attention_ops.weights_dropout(self)

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=attention_ops.clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        check_rank("inputs", inputs_shape, known_features=True)
        self.query_dense = self._dense(self.units, "query")
        self.key_dense = self._dense(self.units, "key")
        self.value_dense = self._dense(self.value_units, "value")
        for dense in (self.query_dense, self.key_dense, self.value_dense):
            dense.build(inputs_shape)
        if self.score == "additive":
            self.score_vector = self.add_weight(
                name="score_vector",
                shape=(self.units,),
                initializer=attention_ops.clone_initializer(self.kernel_initializer),
            )
        self.built = True

    def _check_call_shapes(self, inputs, mask, attention_mask):
        """Returns `(batch, length)`, each `None` where unknown."""
        # Wrong shapes would otherwise broadcast silently or fail in a kernel.
        shape = known_shape(inputs)
        if shape is not None:
            check_rank("inputs", shape)
        batch, length = (shape or (None, None))[:2]
        if self.built:
            want = self.query_dense.kernel.shape[0]
            check_shape("inputs", inputs, (None, None, want), f"(batch, length, {want}) as built")
        check_shape("mask", mask, (batch, length), "(batch, length)")
        check_shape(
            "attention_mask",
            attention_mask,
            (None if batch is None else (batch, 1), length, length),
            "(batch or 1, length, length)",
        )
        return batch, length

    # Keras's call convention (a mirror of Keras): inputs, mask, the options, training last.
    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        inputs = attention_ops.without_keras_mask(inputs)
        batch, length = self._check_call_shapes(inputs, mask, attention_mask)
        q = self.query_dense(inputs)
        k = self.key_dense(inputs)
        v = self.value_dense(inputs)
        if self.score == "scaled_dot":
            q = ops.multiply(q, ops.cast(1.0 / math.sqrt(self.units), q.dtype))
        chunk_size = resolve_chunk_size(
            self.chunk_size, batch, 1, length, length, return_attention_scores
        )
        context, weights, has_keys = attend(
            q,
            k,
            v,
            attention_ops.Weighting.of(self, training),
            Visibility.of(self, self.causal, mask, mask, attention_mask),
            need_weights=return_attention_scores,
            chunk_size=chunk_size,
            aligned=True,
        )
        if has_keys is not None:
            context = context * ops.cast(has_keys, context.dtype)
        if return_attention_scores:
            return context, ops.cast(weights, self.compute_dtype)
        return context

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, inputs_shape, return_attention_scores=False):
        output_shape = (*inputs_shape[:-1], self.value_units)
        if not return_attention_scores:
            return output_shape
        return output_shape, (inputs_shape[0], inputs_shape[1], inputs_shape[1])

    # Keras's get_config: every constructor argument, serialized as Keras does (a mirror of Keras).
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "value_units": self.value_units,
                "score": self.score,
                "normalize": self.normalize,
                "include_self": self.include_self,
                "window": self.window,
                "causal": self.causal,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
            }
        )
        return config
