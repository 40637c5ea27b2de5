"""Attention masks built from `range` comparisons.

Masks are computed by arithmetic on `ops.arange` comparisons rather than by
slicing a precomputed triangle: a slice whose bounds depend on a dynamic
sequence length becomes a Flex `StridedSlice` in TFLite, while comparisons of
ranges stay builtin (docs/facts.md).

Convention everywhere: a mask is boolean (or 0/1), `True` means "may attend".
"""

from keras import ops


def structural_mask(
    query_length,
    key_length,
    *,
    causal=False,
    window=None,
    include_self=True,
    query_offset=0,
    key_valid_length=None,
):
    """Returns a `[query_length, key_length]` boolean mask, or `None`.

    Args:
        query_length: int or scalar tensor, number of queries.
        key_length: int or scalar tensor, number of keys.
        causal: query `i` may only attend to keys `j <= i` (absolute positions).
        window: `None` or int; query `i` may only attend to `|i - j| <= window`.
        include_self: whether query `i` may attend to key `i`.
        query_offset: absolute position of the first query (the cache index
            during incremental decoding; keys always start at position 0).
        key_valid_length: `None` or int/scalar tensor; keys at positions
            `>= key_valid_length` are masked (unwritten cache slots).

    Returns:
        A boolean tensor, or `None` when nothing is masked.
    """
    needs_mask = causal or window is not None or not include_self or key_valid_length is not None
    if not needs_mask:
        return None
    q_pos = ops.expand_dims(ops.arange(query_length, dtype="int32"), 1)
    q_pos = q_pos + ops.cast(query_offset, "int32")
    k_pos = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return position_mask(
        q_pos,
        k_pos,
        causal=causal,
        window=window,
        include_self=include_self,
        key_valid_length=key_valid_length,
    )


def position_mask(q_pos, k_pos, *, causal, window, include_self, key_valid_length=None):
    """The structural mask for query positions `[Tq, 1]` and key positions
    `[1, Tk]` (absolute, int32); also used per block by the chunked path."""
    mask = ops.ones_like(q_pos - k_pos, dtype="bool")
    if causal:
        mask = ops.logical_and(mask, k_pos <= q_pos)
    if window is not None:
        mask = ops.logical_and(mask, ops.abs(q_pos - k_pos) <= window)
    if not include_self:
        mask = ops.logical_and(mask, ops.not_equal(q_pos, k_pos))
    if key_valid_length is not None:
        mask = ops.logical_and(mask, k_pos < ops.cast(key_valid_length, "int32"))
    return mask


def combine_masks(
    structural=None,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
):
    """Merges all mask sources into one broadcastable `[B|1, Tq, Tk]` mask.

    Args:
        structural: `[Tq, Tk]` mask from `structural_mask`, or `None`.
        query_mask: `[B, Tq]` padding mask of the queries, or `None`.
        key_mask: `[B, Tk]` padding mask of the keys, or `None`.
        attention_mask: `[B, Tq, Tk]` (or broadcastable) explicit mask, or
            `None`.

    Returns:
        A float32 0/1 tensor of rank 3, or `None` when there is no mask at all.
        Float, not boolean: the masks meet the scores in float arithmetic
        anyway, and a bool -> float cast has no integer kernel, so an int8
        model would leave the integer accelerator for it. Masks given as 0/1
        floats (the tagger's) stay in products of quantizable tensors.
    """
    mask = None

    def _and(a, b):
        b = ops.cast(b, "float32")
        return b if a is None else a * b

    # The full [B, Tq, Tk] factor comes first, so every later product broadcasts
    # one operand only: the mobile GPU delegate has no MUL broadcasting both ways.
    if query_mask is not None and key_mask is not None:
        # The padding outer product as a matmul, [B, Tq, 1] x [B, 1, Tk], for the
        # same reason.
        mask = ops.matmul(
            ops.expand_dims(ops.cast(query_mask, "float32"), -1),
            ops.expand_dims(ops.cast(key_mask, "float32"), -2),
        )
    elif query_mask is not None:
        mask = _and(mask, ops.expand_dims(query_mask, -1))
    elif key_mask is not None:
        mask = _and(mask, ops.expand_dims(key_mask, -2))
    if attention_mask is not None:
        if len(attention_mask.shape) == 2:
            attention_mask = ops.expand_dims(attention_mask, 0)
        mask = _and(mask, attention_mask)
    if structural is not None:
        mask = _and(mask, ops.expand_dims(structural, 0))
    return mask
