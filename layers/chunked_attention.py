"""Attention block by block with an online softmax (flash-attention style).

No `[Tq, Tk]` tensor is ever built, so memory grows linearly with the length.
Dot-product scores without active dropout take `layers.flash_attention`, whose
backward is linear in memory too; additive scores and dropout run the block
loop here and differentiate it. `chunk_size="auto"` decides from the static
shapes whether a call is chunked at all (`resolve_chunk_size`).

Layout as in `layers.attention_ops`: queries `[B, Tq, H, d]`, keys
`[B, Tk, H, d]`, values `[B, Tk, H, dv]`.
"""

import keras
from keras import ops

from layers import attention_ops, flash_attention
from layers.masks import (
    MASK_PENALTY,
    block_keep_mask,
    pad_axis1,
    padded_block_masks,
    visible_key_blocks,
)

# `chunk_size="auto"`: chunking turns on when one sequence's float32 scores,
# all heads, would reach AUTO_MIN_ENTRIES entries per head (a 4096 x 4096
# matrix), or the whole batch's AUTO_MAX_BYTES; below that the full path is
# faster (fewer, larger matmuls) and fits.
AUTO_CHUNK_SIZE = 1024
AUTO_MIN_ENTRIES = 4096 * 4096
AUTO_MAX_BYTES = 2**30


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


def chunked_attention_context(query, key, value, *, chunk_size, weighting, visibility):
    """Memory-efficient attention: the same result as `attention_ops.attention_context`.

    Queries and keys are processed in `chunk_size` blocks; softmax runs
    online (flash-attention style: a running max `m`, normaliser `l` and
    accumulator per query), so no `[Tq, Tk]` tensor is ever built and memory
    grows linearly with the length. Masks are built per block from positions
    and the `[B, T]` padding masks; blocks that the causal or window
    structure masks completely are skipped.

    Args:
        query, key, value: as in `attention_context` (per-head layout).
        chunk_size: int, block size for queries and keys.
        weighting: an `attention_ops.Weighting` (scores, normalisation,
            dropout on the normalised weights).
        visibility: a `layers.masks.Visibility`; its `attention_mask` is
            itself quadratic in memory (sliced per block).

    Returns:
        `(context [B, Tq, H, dv] in the value dtype, has_keys [B, Tq, 1]
        float32)`: fully masked query rows have zero context, as on the full
        path, and `has_keys` 0.
    """
    if flash_attention.uses_flash(weighting):
        return flash_attention.flash_attention(
            query,
            key,
            value,
            chunk_size=chunk_size,
            visibility=visibility,
            normalize=weighting.normalize,
        )
    # Additive scores and dropout: autodiff through the block loop (linear
    # memory forward; its backward keeps every block).
    c = chunk_size
    score, normalize = weighting.score, weighting.normalize
    causal, window = visibility.causal, visibility.window
    batch = ops.shape(query)[0]
    length_q, length_k = ops.shape(query)[1], ops.shape(key)[1]
    heads, value_dim = query.shape[2], value.shape[3]
    out_dtype = value.dtype
    q, k, v = pad_axis1(query, c), pad_axis1(key, c), pad_axis1(value, c)
    padded = padded_block_masks(batch, length_q, length_k, c, visibility)
    offset = padded.query_offset
    num_q = ops.shape(q)[1] // c
    num_k = ops.shape(k)[1] // c

    def key_range(qi):
        return visible_key_blocks(qi, c, offset, num_k, causal, window)

    def query_block(block):
        # A map over query blocks, not a loop writing into a buffer: the
        # keras.ops slice_update lowers to XlaDynamicUpdateSlice, which has no
        # gradient in TensorFlow.
        qi, qb = block
        q_start = qi * c
        zero = ops.zeros((), "int32")
        m0 = ops.full((batch, heads, c), -1e30, "float32")
        l0 = ops.zeros((batch, heads, c), "float32")
        seen0 = ops.zeros((batch, 1, c), "float32")
        acc0 = ops.zeros((batch, c, heads, value_dim), "float32")

        def key_block(ki, m, l, seen, acc):
            k_start = ki * c
            kb = ops.slice(k, [zero, k_start, zero, zero], [batch, c, heads, k.shape[3]])
            vb = ops.slice(v, [zero, k_start, zero, zero], [batch, c, heads, value_dim])
            keep = block_keep_mask(q_start, k_start, batch=batch, block_size=c, visibility=padded)
            seen = seen + ops.sum(keep, axis=-1)
            if score == "additive":
                s = attention_ops.additive_scores(qb, kb, weighting.score_vector)
            else:
                s = attention_ops.dot_scores(qb, kb)
            s = ops.cast(s, "float32")
            if normalize == "softmax":
                s = s + (1.0 - keep) * MASK_PENALTY
                m_new = ops.maximum(m, ops.max(s, axis=-1))
                p = ops.exp(s - ops.expand_dims(m_new, -1)) * keep
                rescale = ops.exp(m - m_new)
                l = l * rescale + ops.sum(p, axis=-1)
                acc = acc * ops.expand_dims(ops.transpose(rescale, (0, 2, 1)), -1)
                m = m_new
            else:
                p = ops.relu(s) * keep
            if weighting.dropout is not None:
                p = weighting.dropout(p, training=weighting.training)
            acc = acc + attention_ops.weighted_sum(p, ops.cast(vb, "float32"))
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
    block_ids = ops.arange(num_q, dtype="int32")
    acc, valid = ops.map(query_block, (block_ids, q_blocks))
    # [num_q, B, c, ...] -> [B, num_q * c, ...]
    output = ops.reshape(ops.transpose(acc, (1, 0, 2, 3, 4)), (batch, num_q * c, heads, value_dim))
    has_keys = ops.reshape(ops.transpose(valid, (1, 0, 2, 3)), (batch, num_q * c, 1))
    return ops.cast(output[:, :length_q], out_dtype), has_keys[:, :length_q]
