"""The attention computation shared by `SelfAttention` and `MultiHeadAttention`.

Tensors are laid out per head: queries `[B, Tq, H, d]`, keys `[B, Tk, H, d]`,
values `[B, Tk, H, dv]`, scores and weights `[B, H, Tq, Tk]` (rank <= 4 for the
dot-product scores, which the mobile GPU delegate needs). A single head may
drop the head axis (`[B, T, d]`, weights `[B, Tq, Tk]`): squeezing it out
afterwards does not convert to TFLite with dynamic shapes.

One rule for fully masked query rows, on every path: their attention weights
are all zero, so their context vector is zero (the layers then also zero their
output). Keras's own layer gives uniform weights on one path and zeros on
another (docs/facts.md).
"""

import numbers

import keras
from keras import ops

from layers import flash_attention
from layers.masks import position_mask
from layers.softmax_attention import softmax_attention

SCORES = ("dot", "scaled_dot", "additive")
NORMALIZATIONS = ("softmax", "relu")

# Added to masked scores before the online softmax of the chunked path (float32
# there, where -1e9 is representable; in float16 it would be -inf).
_MASK_PENALTY = -1e9
# How far below a row's lowest score the full path puts masked scores.
_MASK_MARGIN = 20.0


# `chunk_size="auto"`: chunking turns on when one sequence's float32 scores,
# all heads, would reach AUTO_MIN_ENTRIES entries per head (a 4096 x 4096
# matrix), or the whole batch's AUTO_MAX_BYTES; below that the full path is
# faster (fewer, larger matmuls) and fits.
AUTO_CHUNK_SIZE = 1024
AUTO_MIN_ENTRIES = 4096 * 4096
AUTO_MAX_BYTES = 2**30


def check_chunk_size(chunk_size):
    """`None`, `"auto"` or an int >= 1; anything else is a ValueError."""
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, numbers.Integral)
        or chunk_size < 1
    ):
        raise ValueError(
            '`chunk_size` must be None, "auto" or an integer >= 1. '
            f"Received: chunk_size={chunk_size!r}"
        )
    return int(chunk_size)


def resolve_chunk_size(chunk_size, batch, heads, length_q, length_k):
    """The block size a call runs with: `None` (full path) or an int.

    `"auto"` decides from the static shapes; a length unknown while tracing
    (a TensorFlow graph with dynamic lengths) keeps the full path, which
    also converts to TFLite without loops."""
    if not (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if length_q is None or length_k is None:
        return None
    entries = int(length_q) * int(length_k)
    total = entries * heads * int(batch or 1) * 4
    if entries >= AUTO_MIN_ENTRIES or total >= AUTO_MAX_BYTES:
        return AUTO_CHUNK_SIZE
    return None


def compiled_by_xla():
    """True while tracing for XLA: a TensorFlow function with `jit_compile=True`,
    or anything under JAX. There XLA fuses autodiff's softmax backward itself and
    `softmax_attention`'s hand-written one measured ~10% slower (N=1024)."""
    backend = keras.backend.backend()
    if backend == "jax":
        return True
    if backend != "tensorflow":
        return False
    import tensorflow as tf

    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # private module moved: keep the faster non-XLA default
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def dot_scores(query, key):
    """`[B, Tq, H, d] x [B, Tk, H, d] -> [B, H, Tq, Tk]`; without the head
    axis `[B, Tq, d] x [B, Tk, d] -> [B, Tq, Tk]`."""
    if len(query.shape) == 3:
        return ops.einsum("bqd,bkd->bqk", query, key)
    return ops.einsum("bqhd,bkhd->bhqk", query, key)


def additive_scores(query, key, vector):
    """Bahdanau scores `w_h . tanh(q_i + k_j)` per head `h`.

    The query and key projections already are the `W1 q`, `W2 k` of the
    additive formula, so only the score vector `w` (`[H, d]`, or `[d]`
    without the head axis) is extra.
    """
    if len(query.shape) == 3:
        q = ops.expand_dims(query, 2)  # B,Tq,1,d
        k = ops.expand_dims(key, 1)  # B,1,Tk,d
        return ops.einsum("bqkd,d->bqk", ops.tanh(q + k), vector)
    q = ops.expand_dims(ops.transpose(query, (0, 2, 1, 3)), 3)  # B,H,Tq,1,d
    k = ops.expand_dims(ops.transpose(key, (0, 2, 1, 3)), 2)  # B,H,1,Tk,d
    return ops.einsum("bhqkd,hd->bhqk", ops.tanh(q + k), vector)


def normalize_scores(scores, mask, normalize):
    """Turns raw scores into attention weights, in float32.

    Args:
        scores: `[B, H, Tq, Tk]` raw scores, any float dtype.
        mask: `None` or 0/1 mask (float32 from `combine_masks`, or boolean)
            broadcastable to `[B, 1, Tq, Tk]`.
        normalize: `"softmax"` or `"relu"` (`alpha' = relu(alpha)`, no
            renormalisation, as in the lecture notes).

    Returns:
        float32 weights of the scores' shape; exactly zero where masked.
    """
    scores = ops.cast(scores, "float32")
    keep = None if mask is None else ops.cast(mask, "float32")
    if normalize == "softmax":
        if keep is not None:
            # Masked scores go to the row's minimum minus a margin rather than
            # to -1e9: a huge constant would stretch the softmax input's range
            # and wipe out its resolution under int8 quantization. Each
            # masked key then weighs at most e^-MARGIN of any real key before
            # the exact zeroing below, well inside float32 parity (1e-5).
            floor = ops.stop_gradient(ops.min(scores, axis=-1, keepdims=True)) - _MASK_MARGIN
            # One-sided broadcasts only ([B,H,Tq,1] - [B,H,Tq,Tk], then times
            # [B,1,Tq,Tk]): the GPU delegate rejects MULs broadcasting both ways.
            scores = scores + (floor - scores) * (1.0 - keep)
        weights = ops.softmax(scores, axis=-1)
    else:
        weights = ops.relu(scores)
    if keep is not None:
        weights = weights * keep
    return weights


def softmax_weights(scores, keep):
    """`normalize_scores` with softmax: the forward `softmax_attention` shares."""
    return normalize_scores(scores, keep, "softmax")


# `keras.ops.dot_product_attention` for plain softmax attention, by backend
# and device. JAX on GPU/TPU: cuDNN's (or Pallas') fused flash attention.
# JAX on CPU: its XLA form measured 1.1-1.5x slower than our einsum path
# (jitted forward+backward, B16 N256 and B4 N1024). TensorFlow: Keras's TF
# kernel is an unfused einsum-softmax, and our hand-written backward
# (`softmax_attention`) is the faster one on CPU (benchmarks/results.md).
# `None`: decide so; `True`/`False` force it (tests, benchmarks).
FUSED = None


def fused_enabled():
    """Whether plain softmax attention runs `keras.ops.dot_product_attention`."""
    if FUSED is not None:
        return bool(FUSED)
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")


def takes_fused(score, normalize, dropout, training, need_weights):
    """Whether attention can run `keras.ops.dot_product_attention`: dot-product
    softmax scores, weights not returned, no active dropout on them, and a
    backend where it is the fastest path (`fused_enabled`)."""
    dropping = (
        dropout is not None and dropout.rate > 0 and training is not None and training is not False
    )
    return (
        fused_enabled()
        and not need_weights
        and score != "additive"
        and normalize == "softmax"
        and not dropping
    )


def fused_context(query, key, value, mask, is_causal=False):
    """`keras.ops.dot_product_attention` in the `attention_context` layout.

    `query` is already scaled (scale 1). `mask`: `None` or 0/1 broadcastable
    to `[B, 1, Tq, Tk]` (`[B, Tq, Tk]` without the head axis). Fully masked
    rows come out as a uniform mix of values; callers zero them (one rule on
    every path), and their zeroed output sends them no gradient.
    """
    single = len(query.shape) == 3
    if single:
        query, key, value = (ops.expand_dims(t, 2) for t in (query, key, value))
    if mask is not None:
        mask = ops.expand_dims(mask, 1)  # [B|1, 1, Tq, Tk]
        shape = (ops.shape(query)[0], 1, ops.shape(query)[1], ops.shape(key)[1])
        mask = ops.broadcast_to(ops.cast(mask, "float32") > 0.5, shape)
    context = ops.dot_product_attention(
        query, key, value, mask=mask, scale=1.0, is_causal=is_causal
    )
    return context[:, :, 0] if single else context


def takes_softmax_backward(score, normalize, dropout, training, need_weights):
    """Whether attention can run through `softmax_attention`'s hand-written
    backward: dot-product softmax scores, weights not returned, no active
    dropout on them, and not traced for XLA (see `compiled_by_xla`)."""
    dropping = (
        dropout is not None and dropout.rate > 0 and training is not None and training is not False
    )
    return (
        not need_weights
        and score != "additive"
        and normalize == "softmax"
        and not dropping
        and not compiled_by_xla()
    )


def weighted_sum(weights, value):
    """`[B, H, Tq, Tk] x [B, Tk, H, dv] -> [B, Tq, H, dv]`; without the head
    axis `[B, Tq, Tk] x [B, Tk, dv] -> [B, Tq, dv]`."""
    if len(value.shape) == 3:
        return ops.einsum("bqk,bkd->bqd", weights, value)
    return ops.einsum("bhqk,bkhd->bqhd", weights, value)


def query_has_keys(mask):
    """`[B|1, Tq, 1]` float: 1 where a query row may attend to something.

    A float max rather than `any`: REDUCE_ANY has no mobile GPU kernel (and the
    cast is a no-op for `combine_masks`' float masks)."""
    return ops.max(ops.cast(mask, "float32"), axis=-1, keepdims=True)


def attention_context(
    query,
    key,
    value,
    mask,
    *,
    score,
    normalize,
    score_vector=None,
    dropout=None,
    training=None,
    need_weights=True,
    is_causal=False,
):
    """Scores, normalises and mixes values; the one path every layer uses.

    Args:
        query: `[B, Tq, H, d]`, already projected (and scaled if the caller
            wants `scaled_dot`).
        key: `[B, Tk, H, d]`.
        value: `[B, Tk, H, dv]`.
        mask: `None` or boolean `[B|1, Tq, Tk]`.
        score: one of `SCORES`.
        normalize: one of `NORMALIZATIONS`.
        score_vector: `[H, d]` for `score="additive"`.
        dropout: optional dropout layer applied to the weights.
        training: passed to `dropout`.
        need_weights: bool; with `False`, dot-product softmax attention
            without active dropout and outside XLA takes
            `softmax_attention`'s faster backward, or
            `keras.ops.dot_product_attention` where `fused_enabled`, and
            returns `None` for the weights.
        is_causal: bool, a causal mask on top of `mask` (self-attention
            without a cache offset); only callers that saw `takes_fused`
            pass it.

    Returns:
        `(context [B, Tq, H, dv], weights [B, H, Tq, Tk] float32)`; the
        weights are returned before dropout.
    """
    per_head = len(query.shape) == 4
    head_mask = mask if mask is None or not per_head else ops.expand_dims(mask, 1)
    if takes_fused(score, normalize, dropout, training, need_weights):
        return fused_context(query, key, value, mask, is_causal), None
    if is_causal:
        raise ValueError("`is_causal=True` is only for the fused path (see `takes_fused`).")
    if takes_softmax_backward(score, normalize, dropout, training, need_weights):
        return softmax_attention(query, key, value, head_mask, softmax_weights), None
    if score == "additive":
        scores = additive_scores(query, key, score_vector)
    else:
        scores = dot_scores(query, key)
    weights = normalize_scores(scores, head_mask, normalize)
    mixed = weights
    if dropout is not None:
        mixed = dropout(weights, training=training)
    context = weighted_sum(ops.cast(mixed, value.dtype), value)
    return context, weights


def without_keras_mask(x):
    """`x` without its attached Keras mask, so that projection sub-layers
    (which do not support masking) neither warn nor drop it; the attention
    layer handles masks itself. A copy (tf.identity) is free after graph optimisation
    and, unlike deleting the attribute, leaves the caller's tensor intact."""
    if x is None or getattr(x, "_keras_mask", None) is None:
        return x
    return ops.copy(x)


def _pad_axis1(x, multiple, value=0):
    """Pads axis 1 of `x` up to a multiple of `multiple` (lengths may be dynamic)."""
    length = ops.shape(x)[1]
    extra = (multiple - length % multiple) % multiple
    pads = [[0, 0], [0, extra]] + [[0, 0]] * (len(x.shape) - 2)
    return ops.pad(x, pads, constant_values=value)


def chunked_attention_context(
    query,
    key,
    value,
    *,
    chunk_size,
    score,
    normalize,
    score_vector=None,
    causal=False,
    window=None,
    include_self=True,
    query_offset=0,
    key_valid_length=None,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    dropout=None,
    training=None,
):
    """Memory-efficient attention: the same result as `attention_context`.

    Queries and keys are processed in `chunk_size` blocks; softmax runs
    online (flash-attention style: a running max `m`, normaliser `l` and
    accumulator per query), so no `[Tq, Tk]` tensor is ever built and memory
    grows linearly with the length. Masks are built per block from positions
    and the `[B, T]` padding masks; blocks that the causal or window
    structure masks completely are skipped.

    Args:
        query, key, value: as in `attention_context` (per-head layout).
        chunk_size: int, block size for queries and keys.
        causal, window, include_self, query_offset, key_valid_length: the
            structural mask, as in `layers.masks.structural_mask`.
        query_mask, key_mask: `None` or `[B, Tq]` / `[B, Tk]` padding masks.
        attention_mask: `None` or `[B, Tq, Tk]` explicit mask (itself
            quadratic in memory; sliced per block).
        dropout, training: dropout on the (normalised) weights.

    Returns:
        `(context [B, Tq, H, dv] in the value dtype, has_keys [B, Tq, 1]
        float32)`: fully masked query rows have zero context, as on the full
        path, and `has_keys` 0.
    """
    if flash_attention.uses_flash(score, normalize, dropout, training):
        return flash_attention.flash_attention(
            query,
            key,
            value,
            chunk_size=chunk_size,
            causal=causal,
            window=window,
            include_self=include_self,
            query_offset=query_offset,
            key_valid_length=key_valid_length,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            normalize=normalize,
        )
    # Additive scores and dropout: autodiff through the block loop (linear
    # memory forward; its backward keeps every block).
    c = chunk_size
    batch = ops.shape(query)[0]
    length_q, length_k = ops.shape(query)[1], ops.shape(key)[1]
    heads, value_dim = query.shape[2], value.shape[3]
    out_dtype = value.dtype
    offset = ops.cast(query_offset, "int32")
    valid_k = ops.cast(length_k if key_valid_length is None else key_valid_length, "int32")
    ones_q = (
        ops.ones((batch, length_q), "bool") if query_mask is None else ops.cast(query_mask, "bool")
    )
    ones_k = ops.ones((batch, length_k), "bool") if key_mask is None else ops.cast(key_mask, "bool")
    q, k, v = _pad_axis1(query, c), _pad_axis1(key, c), _pad_axis1(value, c)
    qmask, kmask = _pad_axis1(ones_q, c, False), _pad_axis1(ones_k, c, False)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")
        attention_mask = ops.broadcast_to(attention_mask, (batch, length_q, length_k))
        attention_mask = _pad_axis1(attention_mask, c, False)
        extra = ops.shape(k)[1] - length_k
        attention_mask = ops.pad(
            attention_mask, [[0, 0], [0, 0], [0, extra]], constant_values=False
        )
    num_q = ops.shape(q)[1] // c
    num_k = ops.shape(k)[1] // c
    positions = ops.arange(c, dtype="int32")

    def key_range(qi):
        """Key blocks that the causal/window structure leaves visible."""
        first_q = qi * c + offset
        last_q = first_q + c - 1
        start, stop = ops.zeros((), "int32"), ops.cast(num_k, "int32")
        if causal:
            stop = ops.minimum(stop, last_q // c + 1)
        if window is not None:
            start = ops.maximum(start, ops.maximum(first_q - window, 0) // c)
            stop = ops.minimum(stop, (last_q + window) // c + 1)
        return start, ops.maximum(stop, start)

    def query_block(block):
        # A map over query blocks, not a loop writing into a buffer: the
        # keras.ops slice_update lowers to XlaDynamicUpdateSlice, which has no
        # gradient in TensorFlow.
        qi, qb, qmb = block
        q_start = qi * c
        zero = ops.zeros((), "int32")
        q_pos = ops.expand_dims(positions + q_start + offset, 1)  # [c, 1]
        m0 = ops.full((batch, heads, c), -1e30, "float32")
        l0 = ops.zeros((batch, heads, c), "float32")
        seen0 = ops.zeros((batch, 1, c), "float32")
        acc0 = ops.zeros((batch, c, heads, value_dim), "float32")

        def key_block(ki, m, l, seen, acc):
            k_start = ki * c
            kb = ops.slice(k, [zero, k_start, zero, zero], [batch, c, heads, k.shape[3]])
            vb = ops.slice(v, [zero, k_start, zero, zero], [batch, c, heads, value_dim])
            kmb = ops.slice(kmask, [zero, k_start], [batch, c])
            k_pos = ops.expand_dims(positions + k_start, 0)  # [1, c]
            keep = ops.logical_and(ops.expand_dims(qmb, 2), ops.expand_dims(kmb, 1))  # [B, c, c]
            structure = position_mask(
                q_pos,
                k_pos,
                causal=causal,
                window=window,
                include_self=include_self,
                key_valid_length=valid_k,
            )
            keep = ops.logical_and(keep, ops.expand_dims(structure, 0))
            if attention_mask is not None:
                keep = ops.logical_and(
                    keep, ops.slice(attention_mask, [zero, q_start, k_start], [batch, c, c])
                )
            keep = ops.cast(ops.expand_dims(keep, 1), "float32")  # [B, 1, c, c]
            seen = seen + ops.sum(keep, axis=-1)
            if score == "additive":
                s = additive_scores(qb, kb, score_vector)
            else:
                s = dot_scores(qb, kb)
            s = ops.cast(s, "float32")
            if normalize == "softmax":
                s = s + (1.0 - keep) * _MASK_PENALTY
                m_new = ops.maximum(m, ops.max(s, axis=-1))
                p = ops.exp(s - ops.expand_dims(m_new, -1)) * keep
                rescale = ops.exp(m - m_new)
                l = l * rescale + ops.sum(p, axis=-1)
                acc = acc * ops.expand_dims(ops.transpose(rescale, (0, 2, 1)), -1)
                m = m_new
            else:
                p = ops.relu(s) * keep
            if dropout is not None:
                p = dropout(p, training=training)
            acc = acc + weighted_sum(p, ops.cast(vb, "float32"))
            return m, l, seen, acc

        if keras.backend.backend() == "jax":
            # JAX differentiates loops only with static bounds: visit every
            # key block (fully masked ones add nothing) instead of skipping.
            start, stop = 0, num_k
        else:
            start, stop = key_range(qi)
        m, l, seen, acc = ops.fori_loop(
            start, stop, lambda ki, carry: key_block(ki, *carry), (m0, l0, seen0, acc0)
        )
        if normalize == "softmax":
            # Rows that saw no key keep l == 0 and acc == 0: output zero.
            # The division sees 1 where l == 0, so its gradient stays finite
            # in the branch `where` discards (0 * inf would be NaN).
            has = l > 0
            inv = ops.where(has, 1.0 / ops.where(has, l, 1.0), 0.0)
            acc = acc * ops.expand_dims(ops.transpose(inv, (0, 2, 1)), -1)
        valid = ops.cast(ops.transpose(seen, (0, 2, 1)) > 0, "float32")  # [B, c, 1]
        return acc, valid

    # [B, num_q * c, ...] -> [num_q, B, c, ...] to scan over query blocks.
    q_blocks = ops.transpose(ops.reshape(q, (batch, num_q, c, heads, q.shape[3])), (1, 0, 2, 3, 4))
    qmask_blocks = ops.transpose(ops.reshape(qmask, (batch, num_q, c)), (1, 0, 2))
    block_ids = ops.arange(num_q, dtype="int32")
    acc, valid = ops.map(query_block, (block_ids, q_blocks, qmask_blocks))
    # [num_q, B, c, ...] -> [B, num_q * c, ...]
    output = ops.reshape(ops.transpose(acc, (1, 0, 2, 3, 4)), (batch, num_q * c, heads, value_dim))
    has_keys = ops.reshape(ops.transpose(valid, (1, 0, 2, 3)), (batch, num_q * c, 1))
    return ops.cast(output[:, :length_q], out_dtype), has_keys[:, :length_q]


class ScoresOutputSpec:
    """Mixin for layers whose `compute_output_shape(shape,
    return_attention_scores)` gives one shape, or two with the scores."""

    def compute_output_spec(self, inputs, return_attention_scores=False, **kwargs):
        import keras

        shapes = self.compute_output_shape(inputs.shape, return_attention_scores)
        if not return_attention_scores:
            return keras.KerasTensor(shapes, dtype=self.compute_dtype)
        return tuple(keras.KerasTensor(s, dtype=self.compute_dtype) for s in shapes)
