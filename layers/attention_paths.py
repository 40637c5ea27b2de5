"""The path one attention call takes, shared by `SelfAttention` and `MultiHeadAttention`.

Block by block (`layers.flash_attention`) when a chunk size is given; else
the fused kernel with its own local window or causal mask where
`attention_ops.takes_fused` allows; else the full path
(`attention_ops.attention_context`) under one combined mask.
"""

import dataclasses

from keras import ops

from layers import attention_ops, flash_attention


def attend(query, key, value, weighting, visibility, *, need_weights, chunk_size, aligned):
    """Scores every query against every key, normalises and mixes the values.

    Args:
        query: `[B, Tq, H, d]` (or `[B, Tq, d]`, one head without its axis),
            scaled for `"scaled_dot"`.
        key: `[B, Tk, H, d]` (or `[B, Tk, d]`).
        value: `[B, Tk, H, dv]` (or `[B, Tk, dv]`).
        weighting: an `attention_ops.Weighting`.
        visibility: a `layers.masks.Visibility`.
        need_weights: bool, whether the weights are returned.
        chunk_size: `None` or int, run block by block.
        aligned: bool, queries and keys are the same positions
            (self-attention without a cache), so a causal mask or a local
            window may be the fused kernel's own.

    Returns:
        `(context, weights, has_keys)`: the context in the query's layout;
        float32 weights (`[B, H, Tq, Tk]` or `[B, Tq, Tk]`) when
        `need_weights` (else may be `None`); and `None` or a `[B|1, Tq, 1]`
        float 0/1, 0 for query rows that may attend to nothing.
    """
    if chunk_size is not None:
        if need_weights:
            raise ValueError(
                "`return_attention_scores=True` needs the full attention "
                "matrix, which `chunk_size` exists to avoid. Received: "
                f"chunk_size={chunk_size}, return_attention_scores=True"
            )
        single = len(query.shape) == 3
        if single:  # the block loops work per head
            query, key, value = (ops.expand_dims(t, 2) for t in (query, key, value))
            if weighting.score_vector is not None:
                vector = ops.expand_dims(weighting.score_vector, 0)
                weighting = dataclasses.replace(weighting, score_vector=vector)
        context, has_keys = flash_attention.flash_attention(
            query, key, value, chunk_size=chunk_size, visibility=visibility, weighting=weighting
        )
        return (context[:, :, 0] if single else context), None, has_keys
    length_q, length_k = ops.shape(query)[1], ops.shape(key)[1]
    fused = attention_ops.takes_fused(weighting, need_weights)
    # The fused kernel's own local window (JAX's `local_window_size`) or
    # causal mask, where queries and keys are the same positions.
    v = visibility
    own = fused and aligned and v.include_self
    local_window = None
    if own and v.window is not None:
        local_window = attention_ops.fused_window(v.window, v.causal, query.dtype)
    if local_window is not None:
        # Only the padding and explicit masks go to the kernel. A query whose
        # window holds no unmasked key is empty; without padding, every query
        # keeps itself.
        padding = v.padding()
        context = attention_ops.fused_context(query, key, value, padding, v.causal, local_window)
        if padding is None:
            return context, None, None
        return context, None, attention_ops.query_has_keys(v.combined(length_q, length_q))
    # cuDNN's causal flash attention when nothing else is masked: no [T, T] mask at all.
    is_causal = own and v.causal and v.window is None and not v.padded
    if is_causal:
        v = dataclasses.replace(v, causal=False)
    mask = v.combined(length_q, length_k)
    if fused:
        context, weights = attention_ops.fused_context(query, key, value, mask, is_causal), None
    else:
        context, weights = attention_ops.attention_context(
            query, key, value, mask, weighting, need_weights=need_weights
        )
    return context, weights, None if mask is None else attention_ops.query_has_keys(mask)
