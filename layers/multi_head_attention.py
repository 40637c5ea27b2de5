"""Multi-head attention with pluggable scoring, masks and a static KV cache."""

import math

import keras
from keras import ops
from keras.layers import EinsumDense

from layers import attention_ops, kv_cache
from layers.attention_paths import attend
from layers.chunked_attention import resolve_chunk_size
from layers.masks import Visibility, merge_key_masks
from layers.projection import flat_matmul, heads_first_projection
from layers.rotary_embedding import RotaryEmbedding
from layers.softmax_attention import softmax_attention
from layers.validation import (
    check_bool,
    check_choice,
    check_chunk_size,
    check_even,
    check_int,
    check_keras_attention_names,
    check_rank,
    check_rate,
    check_shape,
    known_shape,
)


@keras.saving.register_keras_serializable(package="layers")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head self- and cross-attention, as in "Attention Is All You Need".

    Each head projects the inputs to its own queries, keys and values
    (`Q = W^q I`, `K = W^k I`, `V = W^v I`), scores every query against every
    key, normalises the scores and mixes the values; the heads are concatenated
    and projected by `W^O`. With `score="scaled_dot"` and `normalize="softmax"`
    it computes exactly what `keras.layers.MultiHeadAttention` computes (the
    weights have the same names and shapes and can be copied across), and
    fixes that layer's defects:

    - an explicit `query_mask` is honoured (Keras silently ignores it);
    - the symbolic shape of returned cross-attention scores is right;
    - one rule for query rows that may attend to nothing (fully masked), on
      every code path: their weights and their output are zero;
    - causal and window masks are built from range comparisons, so they stay
      TFLite-builtin at any length.

    It also adds a static-shape KV cache for incremental decoding (the KerasHub
    layout `[batch, 2, max_length, num_heads, key_dim]`, written at
    `cache_index`), local windows, additive scoring, ReLU normalisation and
    rotary position embeddings, and log-length scaling for inputs longer
    than the trained ones (`length_scale`).

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each head's queries and keys.
        value_dim: int, size of each head's values. Defaults to `key_dim`.
        output_dim: int, size of the output. Defaults to the query's last
            dimension.
        score: `"scaled_dot"` (`q.k / sqrt(key_dim)`, default), `"dot"`
            (`q.k`) or `"additive"` (`w^T tanh(q + k)`, Bahdanau).
        normalize: `"softmax"` (default) or `"relu"`.
        include_self: bool, whether query `i` may attend to key `i`.
        window: `None` or int `>= 0`; query `i` only attends to keys `j` with
            `|i - j| <= window` (local attention).
        causal: bool, query `i` only attends to keys `j <= i`.
        dropout: float in `[0, 1)`, dropout on the attention weights.
        use_bias: bool, whether the projections have biases.
        rotary: bool, apply rotary position embeddings to queries and keys.
        length_scale: `None` or int `>= 2`, the longest trained number of
            keys. A query that may see `n` keys has its scores multiplied by
            `max(1, log(n) / log(length_scale))`: attention is unchanged up to
            `length_scale` keys and grows sharper beyond, so that it does not
            spread thinner over the many keys of an input longer than any
            trained one (Chiang and Cholak, 2022). `n` counts the keys left by
            every mask. Dot-product scores only; self-attention with it does
            not take the fused heads-first path.
        chunk_size: `None`, `"auto"` or int. When set, attention runs block
            by block with an online softmax (flash-attention style, in
            `keras.ops`): memory grows linearly with the length instead of
            quadratically, for training too (the backward recomputes each
            block's scores from per-row statistics), and results equal the
            full path to float rounding (1e-5). `"auto"` chunks (blocks of
            1024) when the static lengths make the scores large (a 4096 x
            4096 matrix per head, or 1 GiB for the batch) and keeps the
            full path otherwise or when scores are returned. An int cannot
            be combined with `return_attention_scores`.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        kernel_regularizer, bias_regularizer, kernel_constraint,
            bias_constraint: of the projections (as in Keras's layer).
        seed: optional int, seed of the dropout.
        output_shape, attention_axes, sliding_window, flash_attention,
            use_gate: Keras's names, accepted so that a model written for
            `keras.layers.MultiHeadAttention` runs unchanged: `output_shape`
            (an int or 1-tuple) is `output_dim`; `sliding_window=w` (keys
            with `|i - j| < w`) is `window=w - 1`; `attention_axes` may only
            name the sequence axis (`None`, `1`, `(1,)`, `-2`); `flash_attention`
            may be `None` or `False` (long sequences: `chunk_size`);
            `use_gate` must be `False`.
        **kwargs: other `keras.layers.Layer` arguments (`name`, `dtype`,
            `activity_regularizer`).

    Call arguments:
        query: `[batch, target_length, query_features]`.
        value: `[batch, source_length, value_features]`; defaults to `query`
            (self-attention).
        key: `[batch, source_length, key_features]`; defaults to `value`.
        query_mask: `[batch, target_length]` padding mask of the queries.
            Defaults to the Keras mask of `query`.
        value_mask: `[batch, source_length]` padding mask of the keys and
            values. Defaults to the Keras mask of `value` (of `query` for
            self-attention without a cache).
        key_mask: `[batch, source_length]`, an extra key padding mask.
        attention_mask: boolean `[batch, target_length, source_length]` (or
            broadcastable: `[batch, 1, source_length]`, batch 1);
            `True` where a query may attend to a key.
        cache: `None`, `[batch, 2, max_length, num_heads, key_dim]`, or the
            same split into a pair `(key_cache, value_cache)` of
            `[batch, max_length, num_heads, key_dim]` (every tensor stays
            rank 4, which mobile GPU delegates need); the updated cache is
            returned in the form it came in. With `cache_index`, the new
            keys/values are written into it at `cache_index` and the queries
            attend to all written positions (self-attention decoding).
            Without `cache_index`, the cache is used as precomputed
            keys/values (cross-attention decoding, see `compute_cache`).
        cache_index: int or scalar int tensor, position of the first query.
        return_attention_scores: bool, also return the attention weights
            `[batch, num_heads, target_length, source_length]`.
        training: bool, dropout is active only when training.
        use_causal_mask: bool, this call is causal (Keras's argument; the
            same as constructing the layer with `causal=True`).

    The call takes Keras's arguments in Keras's order (`query, value, key,
    query_mask, value_mask, key_mask, attention_mask,
    return_attention_scores, training, use_causal_mask`), then `cache` and
    `cache_index`.

    Returns:
        `output`, followed by the attention weights if
        `return_attention_scores`, followed by the updated cache if `cache`
        was given.

    Example:

    >>> import numpy as np
    >>> from layers import MultiHeadAttention
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=4, causal=True)
    >>> x = np.random.rand(3, 5, 8).astype("float32")
    >>> y, w = layer(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(w.shape)
    ((3, 5, 8), (3, 2, 5, 5))

    Incremental decoding with the cache gives the output of full attention:

    >>> cache = np.zeros((3, 2, 5, 2, 4), "float32")
    >>> y0, cache = layer(x[:, :1], cache=cache, cache_index=0)
    >>> bool(np.allclose(y0, y[:, :1], atol=1e-5))
    True

    Block by block (`chunk_size`), in memory linear in the length for the
    forward and the backward pass, with the same result:

    >>> chunked = MultiHeadAttention(num_heads=2, key_dim=4, causal=True, chunk_size=2)
    >>> _ = chunked(x)
    >>> chunked.set_weights(layer.get_weights())
    >>> bool(np.allclose(chunked(x), y, atol=1e-5))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Bahdanau et al., 2015](https://arxiv.org/abs/1409.0473)
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864) (rotary)
        - [Chiang and Cholak, 2022](https://arxiv.org/abs/2202.12172)
          (log-length scaling)
    """

    # Keras's MultiHeadAttention signature and checks (a mirror of Keras), plus this layer's.
    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        score="scaled_dot",
        normalize="softmax",
        include_self=True,
        window=None,
        causal=False,
        dropout=0.0,
        use_bias=True,
        rotary=False,
        chunk_size=None,
        length_scale=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        use_gate=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        output_dim, window = check_keras_attention_names(
            output_dim,
            window,
            output_shape,
            attention_axes,
            sliding_window,
            flash_attention,
            use_gate,
        )
        self.num_heads = check_int("num_heads", num_heads)
        self.key_dim = check_int("key_dim", key_dim)
        self.value_dim = check_int("value_dim", value_dim, allow_none=True) or self.key_dim
        self.output_dim = check_int("output_dim", output_dim, allow_none=True)
        self.score = check_choice("score", score, attention_ops.SCORES)
        self.normalize = check_choice("normalize", normalize, attention_ops.NORMALIZATIONS)
        self.include_self = bool(include_self)
        self.window = check_int("window", window, minimum=0, allow_none=True)
        self.causal = bool(causal)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.rotary = bool(rotary)
        self.chunk_size = check_chunk_size(chunk_size)
        self.length_scale = check_int("length_scale", length_scale, minimum=2, allow_none=True)
        if self.length_scale is not None and self.score == "additive":
            raise ValueError(
                "`length_scale` scales dot-product scores; it cannot be combined with "
                f"score='additive'. Received: length_scale={length_scale}"
            )
        if self.rotary:
            check_even("key_dim", self.key_dim, when="`rotary=True`")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.supports_masking = True
        self._dropout_layer = attention_ops.weights_dropout(self)
        self._rotary_layer = None
        if self.rotary:
            self._rotary_layer = RotaryEmbedding(dtype=self.dtype_policy)

    def _dense(self, equation, output_shape, bias_axes, name):
        return EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=attention_ops.clone_initializer(self.kernel_initializer),
            bias_initializer=attention_ops.clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            check_rank(name, shape, known_features=True)
        if (
            value_shape[1] is not None
            and key_shape[1] is not None
            and value_shape[1] != key_shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same sequence length. "
                f"Received: key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )
        h = self.num_heads
        self.query_dense = self._dense("abc,cde->abde", (None, h, self.key_dim), "de", "query")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense("abc,cde->abde", (None, h, self.key_dim), "de", "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense("abc,cde->abde", (None, h, self.value_dim), "de", "value")
        self.value_dense.build(value_shape)
        out_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._dense("abcd,cde->abe", (None, out_dim), "e", "attention_output")
        self.output_dense.build((query_shape[0], query_shape[1], h, self.value_dim))
        if self.score == "additive":
            self.score_vector = self.add_weight(
                name="score_vector",
                shape=(h, self.key_dim),
                initializer=attention_ops.clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
                constraint=self.kernel_constraint,
            )
        self.built = True

    def compute_cache(self, value, key=None, split=False):
        """Projects encoder outputs once into a cross-attention cache.

        Args:
            value: `[batch, source_length, value_features]`.
            key: optional `[batch, source_length, key_features]`.
            split: bool, return the pair `(key_cache, value_cache)` of
                `[batch, source_length, num_heads, key_dim]` instead of one
                stacked tensor.

        Returns:
            `[batch, 2, source_length, num_heads, key_dim]` (or the pair), to
            pass as `cache` (without `cache_index`) at every decoding step.
        """
        kv_cache.check_cache_dims(self.key_dim, self.value_dim)
        key = value if key is None else key
        if not self.built:
            self.build(value.shape, value.shape, key.shape)
        return kv_cache.make_cache(
            self._project(self.key_dense, key), self._project(self.value_dense, value), split
        )

    def _project(self, dense, inputs, in_rank=1, scale=1.0):
        """`dense` applied as one GEMM (`projection.flat_matmul`, measured
        1.1-1.2x faster than `EinsumDense` forward and backward at B=16,
        T=256, C=256); `scale` multiplies the small kernel and bias instead
        of the projected activations."""
        kernel, bias = self._scaled_weights(dense, scale)
        return flat_matmul(inputs, kernel, bias, in_rank)

    def _scaled_weights(self, dense, scale=1.0):
        kernel = ops.cast(dense.kernel, self.compute_dtype)
        bias = ops.cast(dense.bias, self.compute_dtype) if self.use_bias else None
        if scale != 1.0:
            kernel = kernel * ops.cast(scale, self.compute_dtype)
            bias = None if bias is None else bias * ops.cast(scale, self.compute_dtype)
        return kernel, bias

    def _query_scale(self):
        # Applied to the query's kernel: rotary embedding is linear, so this
        # equals scaling the rotated query.
        return 1.0 / math.sqrt(self.key_dim) if self.score == "scaled_dot" else 1.0

    def _qkv_weights(self, query_scale):
        """The query, key and value kernels, and their biases (`None` without)."""
        weights = [
            self._scaled_weights(self.query_dense, query_scale),
            self._scaled_weights(self.key_dense),
            self._scaled_weights(self.value_dense),
        ]
        return [w[0] for w in weights], [w[1] for w in weights] if self.use_bias else None

    def _heads_first(self, self_attention, cache, return_attention_scores, training, chunk_size):
        """Whether self-attention can run in the `[H, B, T, d]` layout: the
        dot-product softmax path with the hand-written backward (see
        `attention_ops.attention_context`), without a cache or chunking,
        which work on `[B, T, H, d]`, and not where the fused kernel runs.
        It fuses the projection and attention stages, so a subclass that
        overrides either of them never takes it."""
        cls = type(self)
        weighting = attention_ops.Weighting.of(self, training)
        return (
            self_attention
            and cls._project_qkv is MultiHeadAttention._project_qkv
            and cls._compute_attention is MultiHeadAttention._compute_attention
            and self.value_dim == self.key_dim
            and cache is None
            and chunk_size is None
            and self.length_scale is None
            and not attention_ops.takes_fused(weighting, return_attention_scores)
            and attention_ops.takes_softmax_backward(weighting, return_attention_scores)
        )

    def _heads_first_call(self, query, query_mask, key_mask, attention_mask, causal):
        """Self-attention projected straight into `[H, B, T, d]`: between the
        projection and the output's `[B, T, H*d]` there is one transpose (of
        the context) instead of a split and four transposes each way
        (forward and backward at B16 N256 took 0.90-0.97x the time of the
        token-major path, A/B in one process)."""
        q, k, v = heads_first_projection(query, *self._qkv_weights(self._query_scale()))
        if self._rotary_layer is not None:
            # Rotary embedding rotates along axis 1 of a rank-3 tensor: fold
            # the heads into the batch, [H*B, T, d], and back.
            shape = ops.shape(q)
            q, k = (
                ops.reshape(self._rotary_layer(ops.reshape(t, (-1, shape[2], self.key_dim))), shape)
                for t in (q, k)
            )
        length = ops.shape(query)[1]
        visibility = Visibility.of(self, causal, query_mask, key_mask, attention_mask)
        mask = visibility.combined(length, length)
        keep = None if mask is None else ops.expand_dims(mask, 0)
        context = softmax_attention(q, k, v, keep, attention_ops.normalize_scores, heads_first=True)
        has_keys = None if mask is None else attention_ops.query_has_keys(mask)
        return self._output_projection(ops.transpose(context, (1, 2, 0, 3)), has_keys)

    def _check_call_shapes(self, query, value, key, cache, cache_index):
        """Checks the inputs' and the cache's shapes (mismatched shapes would
        otherwise broadcast silently or fail deep in a kernel with a message
        that names no argument); returns `(batch, query_length, key_length)`,
        each `None` where unknown."""
        q_shape = known_shape(query)
        if q_shape is not None:
            check_rank("query", q_shape)
        batch, q_len = (q_shape or (None, None))[:2]
        source = value if value is not None else key
        k_len = None
        for name, x in (("value", value), ("key", key)):
            check_shape(name, x, (batch, None, None), "(batch, key_length, features)")
        if source is not None:
            k_len = (known_shape(source) or (None, None))[1]
        elif cache is None:
            k_len = q_len
        for name, x in (("query", query), ("value", value), ("key", key)):
            if self.built:
                want = getattr(self, f"{name}_dense").kernel.shape[0]
                check_shape(name, x, (None, None, want), f"(batch, length, {want}) as built")
        if cache is not None or cache_index is not None:
            k_len = kv_cache.check_cache(
                cache,
                cache_index,
                batch=batch,
                query_length=q_len,
                num_heads=self.num_heads,
                key_dim=self.key_dim,
            )
        return batch, q_len, k_len

    def _check_mask_shapes(self, lengths, query_mask, value_mask, key_mask, attention_mask, step):
        """Checks the masks against `lengths` (`_check_call_shapes`'s); `step`:
        a decoding step's padding masks describe its queries only."""
        batch, q_len, k_len = lengths
        check_shape("query_mask", query_mask, (batch, q_len), "(batch, query_length)")
        if not step:
            check_shape("value_mask", value_mask, (batch, k_len), "(batch, key_length)")
            check_shape("key_mask", key_mask, (batch, k_len), "(batch, key_length)")
        batch_or_one = None if batch is None else (batch, 1)
        # Broadcast over queries too ([B, 1, Tk], as keras-io examples pass).
        check_shape(
            "attention_mask",
            attention_mask,
            (batch_or_one, None if q_len is None else (q_len, 1), k_len),
            "(batch or 1, query_length or 1, key_length)",
        )

    # Keras's MultiHeadAttention.call arguments in order (a mirror of Keras), then the cache.
    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_index=None,
    ):
        # The stages: check -> project -> rotate -> cache -> _compute_attention
        # -> output projection.
        causal = self.causal or check_bool("use_causal_mask", use_causal_mask)
        query, value, key = (attention_ops.without_keras_mask(t) for t in (query, value, key))
        lengths = self._check_call_shapes(query, value, key, cache, cache_index)
        step = cache is not None and cache_index is not None
        self._check_mask_shapes(lengths, query_mask, value_mask, key_mask, attention_mask, step)
        self_attention = value is None and key is None
        batch, q_len, k_len = lengths
        chunk_size = resolve_chunk_size(
            self.chunk_size, batch, self.num_heads, q_len, k_len, return_attention_scores
        )
        if value is None:
            value = query
            if value_mask is None and cache is None:
                value_mask = query_mask
        key = value if key is None else key
        if self._heads_first(self_attention, cache, return_attention_scores, training, chunk_size):
            return self._heads_first_call(
                query, query_mask, merge_key_masks(key_mask, value_mask), attention_mask, causal
            )

        # A cache without `cache_index` holds precomputed keys and values.
        cross_cache = cache is not None and cache_index is None
        offset = 0 if cache_index is None else cache_index
        q, k, v = self._project_qkv(query, key, value, self_attention, cross_cache)
        if self._rotary_layer is not None:
            q = self._rotary_layer(q, start_index=offset)
            if not cross_cache:
                k = self._rotary_layer(k, start_index=offset)
        key_valid_length = None
        if cache is not None:
            kv_cache.check_cache_dims(self.key_dim, self.value_dim)
            if cross_cache:
                k, v = kv_cache.read_cache(cache)
            else:
                k, v, cache = kv_cache.update_cache(cache, k, v, cache_index)
                key_valid_length = ops.cast(cache_index, "int32") + ops.shape(query)[1]
                # Padding masks of the step's tokens describe queries only: the
                # cached keys' padding must come from `attention_mask`.
                value_mask = key_mask = None
        k, v = ops.cast(k, q.dtype), ops.cast(v, q.dtype)
        key_mask = merge_key_masks(key_mask, value_mask)
        if self.length_scale is not None:
            visibility = Visibility.of(
                self,
                causal,
                None,
                key_mask,
                attention_mask,
                query_offset=offset,
                key_valid_length=key_valid_length,
            )
            q = q * self._length_factor(visibility, ops.shape(q)[1], ops.shape(k)[1], q.dtype)

        context, weights, has_keys = self._compute_attention(
            q,
            k,
            v,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            training=training,
            return_attention_scores=return_attention_scores,
            causal=causal,
            query_offset=offset,
            key_valid_length=key_valid_length,
            chunk_size=chunk_size,
            aligned=self_attention and cache is None,
        )
        output = self._output_projection(context, has_keys)

        results = [output]
        if return_attention_scores:
            results.append(ops.cast(weights, self.compute_dtype))
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

    def _length_factor(self, visibility, query_length, key_length, dtype):
        """`max(1, log(n) / log(length_scale))` as `[B|1, Tq, 1, 1]`, `n` the keys
        each query may see (the query's own padding aside: its row is zeroed)."""
        structural = visibility.structural(query_length, key_length)
        if structural is None and visibility.attention_mask is None:
            if visibility.key_mask is None:
                seen = ops.cast(ops.full((1, 1), key_length), "float32")
            else:  # [B, 1]: no [B, Tq, Tk] mask just to count
                seen = ops.sum(ops.cast(visibility.key_mask, "float32"), -1, keepdims=True)
        else:
            seen = ops.sum(visibility.padding(structural), axis=-1)
        factor = ops.log(ops.maximum(seen, 1.0)) / math.log(self.length_scale)
        factor = ops.maximum(factor, 1.0)
        return ops.cast(factor[:, :, None, None], dtype)

    def _project_qkv(self, query, key, value, self_attention=False, cross_cache=False):
        """The projection stage: `[B, T, features]` inputs to per-head
        `[B, T, num_heads, key_dim]` queries and keys and `[B, T, num_heads,
        value_dim]` values, the queries already scaled for `"scaled_dot"`.
        With `cross_cache` the keys and values come from the cache: `None`."""
        query_scale = self._query_scale()
        if cross_cache:
            return self._project(self.query_dense, query, scale=query_scale), None, None
        if self_attention and self.value_dim == self.key_dim:
            # One matmul over the concatenated kernels: the input is read once and
            # the matmul is three times wider, which is faster than three
            # projections. The variables stay separate (Keras's layout, so
            # weights still copy across).
            kernels, biases = self._qkv_weights(query_scale)
            bias = None if biases is None else ops.concatenate(biases, axis=0)
            projected = flat_matmul(query, ops.concatenate(kernels, axis=1), bias)
            return ops.split(projected, 3, axis=2)
        q = self._project(self.query_dense, query, scale=query_scale)
        k = self._project(self.key_dense, key)
        v = self._project(self.value_dense, value)
        return q, k, v

    # Keras's `_compute_attention` arguments first (the override point), then this layer's.
    def _compute_attention(
        self,
        query,
        key,
        value,
        query_mask=None,
        key_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        *,
        causal=False,
        query_offset=0,
        key_valid_length=None,
        chunk_size=None,
        aligned=False,
    ):
        """The attention stage, and the method to override to change it (as
        `keras.layers.MultiHeadAttention._compute_attention`): scores every
        query against every key, normalises and mixes the values, per head.

        `call` has projected, scaled and rotated the inputs and written the
        step into the cache before; it applies the output projection after,
        zeroing the rows that `has_keys` marks empty. A subclass that
        overrides this method never takes the fused heads-first fast path.

        Args:
            query: `[B, Tq, num_heads, key_dim]`, scaled for `"scaled_dot"`.
            key: `[B, Tk, num_heads, key_dim]` (the whole cache's keys while
                decoding).
            value: `[B, Tk, num_heads, value_dim]`.
            query_mask: `None` or `[B, Tq]` padding mask of the queries.
            key_mask: `None` or `[B, Tk]` padding mask of the keys (key and
                value masks merged).
            attention_mask: `None` or `[B|1, Tq|1, Tk]`, `True` where a query
                may attend to a key.
            training: bool, dropout is active only when training.
            return_attention_scores: bool, whether the weights are needed.
            causal, query_offset, key_valid_length: the structure, as
                `layers.masks.Visibility` takes it (`query_offset` is
                `cache_index` while decoding).
            chunk_size, aligned: as `layers.attention_paths.attend` takes them.

        Returns:
            `(context, weights, has_keys)`: `[B, Tq, num_heads, value_dim]`;
            `[B, num_heads, Tq, Tk]` float32 weights when
            `return_attention_scores` (else may be `None`); and `None` or a
            `[B|1, Tq, 1]` float 0/1, 0 for query rows that may attend to
            nothing.
        """
        visibility = Visibility.of(
            self,
            causal,
            query_mask,
            key_mask,
            attention_mask,
            query_offset=query_offset,
            key_valid_length=key_valid_length,
        )
        return attend(
            query,
            key,
            value,
            attention_ops.Weighting.of(self, training),
            visibility,
            need_weights=return_attention_scores,
            chunk_size=chunk_size,
            aligned=aligned,
        )

    def _output_projection(self, context, has_keys=None):
        """The output stage: `[B, T, H, dv]` context to `[B, T, output_dim]`;
        rows whose query may attend to nothing (`has_keys` 0) are zero, one
        rule on every path."""
        output = self._project(self.output_dense, context, in_rank=2)
        if has_keys is not None:
            output = output * ops.cast(has_keys, output.dtype)
        return output

    def compute_mask(self, query, previous_mask=None):
        # Keras passes the mask of the first argument (the query): the output
        # is aligned with the queries, so it keeps their padding.
        return previous_mask

    def compute_output_shape(
        self, query_shape, value_shape=None, key_shape=None, return_attention_scores=False
    ):
        output_shape = (*query_shape[:-1], self.output_dim or query_shape[-1])
        if not return_attention_scores:
            return output_shape
        source_shape = query_shape if value_shape is None else value_shape
        return output_shape, (query_shape[0], self.num_heads, query_shape[1], source_shape[1])

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        cache=None,
        return_attention_scores=False,
        **kwargs,
    ):
        # Written out because the shapes depend on call arguments (scores,
        # cache); a cache fixes the number of keys to its length.
        value_shape = None if value is None else value.shape
        if cache is not None:
            value_shape = (query.shape[0], kv_cache.cache_length(cache), None)
        shapes = self.compute_output_shape(
            query.shape, value_shape, return_attention_scores=return_attention_scores
        )
        shapes = list(shapes) if return_attention_scores else [shapes]
        results = [keras.KerasTensor(shape, dtype=self.compute_dtype) for shape in shapes]
        if cache is not None:
            results.append(
                keras.tree.map_structure(lambda c: keras.KerasTensor(c.shape, dtype=c.dtype), cache)
            )
        return results[0] if len(results) == 1 else tuple(results)

    # Keras's get_config: every constructor argument, serialized as Keras does (a mirror of Keras).
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "score": self.score,
                "normalize": self.normalize,
                "include_self": self.include_self,
                "window": self.window,
                "causal": self.causal,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "rotary": self.rotary,
                "chunk_size": self.chunk_size,
                "length_scale": self.length_scale,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "seed": self.seed,
            }
        )
        return config
