"""Attention block by block with an online softmax, and its linear-memory backward.

Flash-attention-2 in `keras.ops`: the forward visits key blocks with an
online softmax (a running max `m`, normaliser `l` and accumulator per query),
so no `[Tq, Tk]` tensor is ever built, and keeps, per query row, only the
output and the log-sum-exp of its scores; the backward recomputes each visible
block's scores once from them and accumulates dQ, dK and dV in one pass.
Autodiff of the block loop would instead keep every block's weights (quadratic
memory: under JAX the scan stores them all). One `keras.ops.custom_gradient`
serves TensorFlow and JAX. Additive scores and dropout on the weights have no
hand-written backward: they differentiate the same block loop.

Layout as in `attention_ops`: queries `[B, Tq, H, d]`, keys `[B, Tk, H, d]`,
values `[B, Tk, H, dv]`. Inside, everything is head-major `[B, H, T, d]`,
where every product is a plain batched matmul, and float32.
"""

import keras
from keras import ops

from layers import attention_ops
from layers.masks import (
    MASK_PENALTY,
    Visibility,
    block_keep_mask,
    pad_axis1,
    padded_block_masks,
)
from layers.softmax_attention import head_major, transpose_last


def flash_attention(query, key, value, *, chunk_size, visibility=None, weighting=None):
    """Attention in blocks: the same result as `attention_ops.attention_context`.

    Args:
        query: `[B, Tq, H, d]`, already scaled.
        key: `[B, Tk, H, d]`.
        value: `[B, Tk, H, dv]`.
        chunk_size: int, the block size of queries and keys.
        visibility: a `layers.masks.Visibility` (`None`: every key visible);
            its `attention_mask` is itself quadratic in memory (sliced per
            block).
        weighting: an `attention_ops.Weighting` (`None`: dot-product
            softmax). ReLU weights (`relu(q.k)`, no normalisation) need no
            row statistics, and their backward only the scores' sign.

    Returns:
        `(context [B, Tq, H, dv] in the value dtype, has_keys [B, Tq, 1]
        float32)`: a query row that may attend to nothing has zero context
        and `has_keys` 0.
    """
    c = int(chunk_size)
    weighting = weighting or attention_ops.Weighting(score="dot")
    relu = weighting.normalize == "relu"
    additive = weighting.score == "additive"
    given = visibility or Visibility()
    causal, window = given.causal, given.window
    batch = ops.shape(query)[0]
    length_q, length_k = ops.shape(query)[1], ops.shape(key)[1]
    heads, key_dim, value_dim = query.shape[2], query.shape[3], value.shape[3]
    padded = padded_block_masks(batch, length_q, length_k, c, given)
    offset = padded.query_offset
    num_q = ops.shape(padded.query_mask)[1] // c
    num_k = ops.shape(padded.key_mask)[1] // c
    zero = ops.zeros((), "int32")

    # The block loops visit only the (query, key) block pairs that the causal
    # and window structure leaves visible: `(start, stop)` int32 scalars.
    def key_range(qi):
        """Key blocks that query block `qi` sees."""
        first_q = qi * c + offset
        last_q = first_q + c - 1
        start, stop = zero, ops.cast(num_k, "int32")
        if causal:
            stop = ops.minimum(stop, last_q // c + 1)
        if window is not None:
            start = ops.maximum(start, ops.maximum(first_q - window, 0) // c)
            stop = ops.minimum(stop, (last_q + window) // c + 1)
        return start, ops.maximum(stop, start)

    def query_range(ki):
        """Query blocks that see any key of key block `ki`."""
        first_k = ki * c
        last_k = first_k + c - 1
        start, stop = zero, ops.cast(num_q, "int32")
        if causal:
            start = ops.maximum(start, (first_k - offset) // c)
        if window is not None:
            start = ops.maximum(start, (first_k - window - offset) // c)
            stop = ops.minimum(stop, (last_k + window - offset) // c + 1)
        start = ops.minimum(start, stop)
        return start, ops.maximum(stop, start)

    # Nothing to mask in any block (static): no mask arithmetic at all.
    static_lengths = isinstance(length_q, int) and isinstance(length_k, int)
    unmasked = (
        not given.padded
        and given.key_valid_length is None
        and not causal
        and window is None
        and given.include_self
        and static_lengths
        and length_q % c == 0
        and length_k % c == 0
    )

    def keep_block(qi, ki):
        """float32 `[B, 1, c, c]`: 1 where query row may attend to key;
        `None` when nothing is masked."""
        if unmasked:
            return None
        return block_keep_mask(qi * c, ki * c, batch=batch, block_size=c, visibility=padded)

    def block(x, i, width):
        """Block `i` of a head-major `[B, H, T, width]` tensor."""
        return ops.slice(x, [zero, zero, i * c, zero], [batch, heads, c, width])

    def stack_blocks(blocks, width):
        """`[n, B, H, c, w]` from `ops.map` -> `[B, H, n * c, w]`."""
        blocks = ops.transpose(blocks, (1, 2, 0, 3, 4))
        return ops.reshape(blocks, (batch, heads, -1, width))

    def forward(q, k, v, static_bounds=False):
        """`(out, lse, has)` of the head-major, padded, float32 `q`, `k`, `v`:
        `[B, H, Tq', dv]`, `[B, H, Tq', 1]` and `[B, H, Tq', 1]`."""

        def mix(p, ki):
            """The block's weights (after the dropout when active) times its values."""
            if weighting.dropping:
                p = weighting.dropout(p, training=weighting.training)
            return ops.matmul(p, block(v, ki, value_dim))

        def forward_block(qi):
            qb = block(q, qi, key_dim)

            def step(ki, carry):
                m, l, acc = carry
                keep = keep_block(qi, ki)
                kb = block(k, ki, key_dim)
                if additive:
                    vector = weighting.score_vector
                    s = attention_ops.additive_scores(head_major(qb), head_major(kb), vector)
                else:
                    s = ops.matmul(qb, transpose_last(kb))
                if relu:
                    p = ops.relu(s) if keep is None else ops.relu(s) * keep
                    seen = float(c) if keep is None else ops.sum(keep, axis=-1, keepdims=True)
                    return m, l + seen, acc + mix(p, ki)
                if keep is not None:
                    s = s + (1.0 - keep) * MASK_PENALTY
                m_new = ops.maximum(m, ops.max(s, axis=-1, keepdims=True))
                p = ops.exp(s - m_new)
                if keep is not None:
                    p = p * keep
                rescale = ops.exp(m - m_new)
                l = l * rescale + ops.sum(p, axis=-1, keepdims=True)
                acc = acc * rescale + mix(p, ki)
                return m_new, l, acc

            m0 = ops.full((batch, heads, c, 1), -1e30, "float32")
            l0 = ops.zeros((batch, heads, c, 1), "float32")
            acc0 = ops.zeros((batch, heads, c, value_dim), "float32")
            start, stop = (0, num_k) if static_bounds else key_range(qi)
            m, l, acc = ops.fori_loop(start, stop, step, (m0, l0, acc0))
            # Rows that saw no key keep l == 0 and acc == 0: output zero, and
            # a log-sum-exp of 0 (their keys are all masked in the backward).
            has = l > 0
            if relu:  # l counts the visible keys; nothing to normalise
                return acc, ops.zeros_like(l), ops.cast(has, "float32")
            safe_l = ops.where(has, l, 1.0)
            out = acc / safe_l
            lse = ops.where(has, m + ops.log(safe_l), 0.0)
            return out, lse, ops.cast(has, "float32")

        out, lse, has = ops.map(forward_block, ops.arange(num_q, dtype="int32"))
        return stack_blocks(out, value_dim), stack_blocks(lse, 1), stack_blocks(has, 1)

    def prepare(t):
        return ops.cast(head_major(pad_axis1(t, c)), "float32")

    def context_and_has_keys(out, has):
        has_keys = ops.transpose(has[:, :1], (0, 2, 1, 3))[:, :length_q, 0]
        return ops.cast(head_major(out)[:, :length_q], value.dtype), has_keys

    if additive or weighting.dropping:
        # No hand-written backward: autodiff through the block loop (linear
        # memory forward; its backward keeps every block). JAX differentiates
        # loops only with static bounds: there every key block is visited
        # (fully masked ones add nothing) instead of skipping.
        static = keras.backend.backend() == "jax"
        out, _, has = forward(*(prepare(t) for t in (query, key, value)), static)
        return context_and_has_keys(out, has)

    @ops.custom_gradient
    def attend(q, k, v):
        # TensorFlow's eager custom_gradient runs this body with the tape
        # still recording, which would keep every block's intermediates
        # alive; nothing in it needs autodiff (`grad` below is the gradient).
        in_dtypes = (q.dtype, k.dtype, v.dtype)
        q, k, v = (prepare(ops.stop_gradient(t)) for t in (q, k, v))
        out, lse, has = forward(q, k, v)
        context, has_keys = context_and_has_keys(out, has)

        def grad(*upstream, **unused):
            d_out = upstream[0]
            if isinstance(d_out, (tuple, list)):  # JAX passes the outputs' tuple
                d_out = d_out[0]
            d_out = ops.cast(head_major(pad_axis1(d_out, c)), "float32")
            # flash-attention's D: sum_j P_ij dP_ij equals rowsum(dO * O).
            row = ops.sum(d_out * out, axis=-1, keepdims=True)

            def key_step(ki, carry):
                # One pass over the visible (query, key) block pairs: each
                # block's scores are recomputed once and feed dQ, dK and dV.
                d_q, d_k, d_v = carry
                kb, vb = block(k, ki, key_dim), block(v, ki, value_dim)

                def query_step(qi, inner):
                    d_q, d_kb, d_vb = inner
                    qb, d_ob = block(q, qi, key_dim), block(d_out, qi, value_dim)
                    s = ops.matmul(qb, transpose_last(kb))
                    keep = keep_block(qi, ki)
                    if relu:
                        active = ops.cast(s > 0, "float32")
                        if keep is not None:
                            active = active * keep
                        p = s * active
                    else:
                        if keep is not None:
                            s = s + (1.0 - keep) * MASK_PENALTY
                        p = ops.exp(s - block(lse, qi, 1))
                        if keep is not None:
                            p = p * keep
                    d_vb = d_vb + ops.matmul(transpose_last(p), d_ob)
                    d_p = ops.matmul(d_ob, transpose_last(vb))
                    d_s = d_p * active if relu else p * (d_p - block(row, qi, 1))
                    d_kb = d_kb + ops.matmul(transpose_last(d_s), qb)
                    start = [zero, zero, qi * c, zero]
                    d_q = ops.slice_update(
                        d_q, start, block(d_q, qi, key_dim) + ops.matmul(d_s, kb)
                    )
                    return d_q, d_kb, d_vb

                start, stop = query_range(ki)
                d_q, d_kb, d_vb = ops.fori_loop(
                    start, stop, query_step, (d_q, ops.zeros_like(kb), ops.zeros_like(vb))
                )
                at = [zero, zero, ki * c, zero]
                return d_q, ops.slice_update(d_k, at, d_kb), ops.slice_update(d_v, at, d_vb)

            d_q, d_k, d_v = ops.fori_loop(
                zero,
                ops.cast(num_k, "int32"),
                key_step,
                (ops.zeros_like(q), ops.zeros_like(k), ops.zeros_like(v)),
            )
            return tuple(
                ops.cast(head_major(g)[:, :n], dtype)
                for g, n, dtype in zip((d_q, d_k, d_v), (length_q, length_k, length_k), in_dtypes)
            )

        return (context, has_keys), grad

    return attend(query, key, value)
