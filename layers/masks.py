"""Attention masks built from `range` comparisons.

Masks are computed by arithmetic on `ops.arange` comparisons rather than by
slicing a precomputed triangle: a slice whose bounds depend on a dynamic
sequence length becomes a Flex `StridedSlice` in TFLite, while comparisons of
ranges stay builtin (docs/facts.md).

Convention everywhere: a mask is boolean (or 0/1), `True` means "may attend".
"""

import dataclasses

from keras import ops


def position_mask(q_pos, k_pos, *, causal, window, include_self, key_valid_length=None):
    """The structure's mask for query positions `[Tq, 1]` and key positions
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
        structural: `[Tq, Tk]` mask from `Visibility.structural`, or `None`.
        query_mask: `[B, Tq]` padding mask of the queries, or `None`.
        key_mask: `[B, Tk]` padding mask of the keys, or `None`.
        attention_mask: `[B|1, Tq|1, Tk]` explicit mask, or `None`.

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
        mask = _and(mask, attention_mask)
    if structural is not None:
        mask = _and(mask, ops.expand_dims(structural, 0))
    return mask


@dataclasses.dataclass(frozen=True, eq=False)
class Visibility:
    """Which keys each query may attend to, as every attention path takes it:
    the structure (`causal`: query `i` attends to keys `j <= i`, absolute
    positions; `window`: to `|i - j| <= window`; `include_self`: to key `i`;
    `query_offset`: the position of the first query, the cache index while
    decoding; `key_valid_length`: keys from there on are unwritten cache
    slots) and the padding and
    explicit masks (`combine_masks`' `[B, Tq]`, `[B, Tk]` and `[B|1, Tq|1, Tk]`,
    each `None` when absent)."""

    causal: bool = False
    window: object = None
    include_self: bool = True
    query_offset: object = 0
    key_valid_length: object = None
    query_mask: object = None
    key_mask: object = None
    attention_mask: object = None

    @classmethod
    def of(cls, layer, causal, query_mask, key_mask, attention_mask, **structure):
        """An attention layer's call: the layer's `window` and `include_self`,
        the call's causality, masks and `structure` (the offsets)."""
        return cls(
            causal,
            layer.window,
            layer.include_self,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            **structure,
        )

    def structural(self, query_length, key_length):
        """The `[query_length, key_length]` boolean mask of the structure
        (lengths: ints or scalar tensors; keys start at position 0, queries at
        `query_offset`), or `None` when it masks nothing."""
        if not (
            self.causal
            or self.window is not None
            or not self.include_self
            or self.key_valid_length is not None
        ):
            return None
        q_pos = ops.expand_dims(ops.arange(query_length, dtype="int32"), 1)
        q_pos = q_pos + ops.cast(self.query_offset, "int32")
        k_pos = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
        return position_mask(
            q_pos,
            k_pos,
            causal=self.causal,
            window=self.window,
            include_self=self.include_self,
            key_valid_length=self.key_valid_length,
        )

    def combined(self, query_length, key_length):
        """Every source in one `[B|1, Tq, Tk]` mask (`combine_masks`), or `None`."""
        return self.padding(self.structural(query_length, key_length))

    def padding(self, structural=None):
        """The padding and explicit masks, with `structural` if given, combined."""
        return combine_masks(structural, self.query_mask, self.key_mask, self.attention_mask)

    @property
    def padded(self):
        """Whether a padding or explicit mask is given."""
        return not (
            self.query_mask is None and self.key_mask is None and self.attention_mask is None
        )


# The block-wise path (`layers.flash_attention`): masks
# are built per (query block, key block) pair, never as one [Tq, Tk] tensor.

# Added to masked scores before an online softmax: finite (no inf - inf = NaN)
# and far below any real score in float32 (in float16 it would be -inf).
MASK_PENALTY = -1e9


def pad_axis1(x, multiple, value=0):
    """Pads axis 1 of `x` up to a multiple of `multiple` (lengths may be dynamic)."""
    length = ops.shape(x)[1]
    extra = (multiple - length % multiple) % multiple
    pads = [[0, 0], [0, extra]] + [[0, 0]] * (len(x.shape) - 2)
    return ops.pad(x, pads, constant_values=value)


def padded_block_masks(batch, length_q, length_k, block_size, visibility):
    """`visibility` as a block-wise path and `block_keep_mask` take it (the
    batch size and lengths may be dynamic): a `Visibility` whose masks are
    boolean `[B, Tq']`, `[B, Tk']` and `None` or `[B, Tq', Tk']`, padded with
    `False` to multiples of `block_size` (`Tq'`, `Tk'`; a padding mask not
    given is all `True` before padding), whose `query_offset` is int32 and
    whose `key_valid_length` is an int32 scalar (`length_k` when not given)."""
    c = block_size
    query_mask, key_mask = visibility.query_mask, visibility.key_mask
    attention_mask = visibility.attention_mask
    qmask = (
        ops.ones((batch, length_q), "bool") if query_mask is None else ops.cast(query_mask, "bool")
    )
    kmask = ops.ones((batch, length_k), "bool") if key_mask is None else ops.cast(key_mask, "bool")
    qmask, kmask = pad_axis1(qmask, c, False), pad_axis1(kmask, c, False)
    if attention_mask is not None:
        attention_mask = ops.broadcast_to(
            ops.cast(attention_mask, "bool"), (batch, length_q, length_k)
        )
        attention_mask = pad_axis1(attention_mask, c, False)
        extra = ops.shape(kmask)[1] - length_k
        attention_mask = ops.pad(
            attention_mask, [[0, 0], [0, 0], [0, extra]], constant_values=False
        )
    valid_k = visibility.key_valid_length
    return dataclasses.replace(
        visibility,
        query_offset=ops.cast(visibility.query_offset, "int32"),
        key_valid_length=ops.cast(length_k if valid_k is None else valid_k, "int32"),
        query_mask=qmask,
        key_mask=kmask,
        attention_mask=attention_mask,
    )


def block_keep_mask(q_start, k_start, *, batch, block_size, visibility):
    """float32 `[B, 1, c, c]`: 1 where a query of the block starting at `q_start`
    may attend to a key of the block starting at `k_start`.

    Args:
        q_start, k_start: int32 scalars, the first (padded) row of each block.
        batch: the batch size; block_size: int `c`.
        visibility: from `padded_block_masks`.
    """
    c = block_size
    v = visibility
    zero = ops.zeros((), "int32")
    positions = ops.arange(c, dtype="int32")
    qmb = ops.slice(v.query_mask, [zero, q_start], [batch, c])
    kmb = ops.slice(v.key_mask, [zero, k_start], [batch, c])
    keep = ops.logical_and(ops.expand_dims(qmb, 2), ops.expand_dims(kmb, 1))  # [B, c, c]
    structure = position_mask(
        ops.expand_dims(positions + q_start + v.query_offset, 1),
        ops.expand_dims(positions + k_start, 0),
        causal=v.causal,
        window=v.window,
        include_self=v.include_self,
        key_valid_length=v.key_valid_length,
    )
    keep = ops.logical_and(keep, ops.expand_dims(structure, 0))
    if v.attention_mask is not None:
        keep = ops.logical_and(
            keep, ops.slice(v.attention_mask, [zero, q_start, k_start], [batch, c, c])
        )
    return ops.cast(ops.expand_dims(keep, 1), "float32")


def merge_key_masks(key_mask, value_mask):
    """One `[B, Tk]` mask from a key mask and a value mask (either may be `None`)."""
    if key_mask is not None and value_mask is not None:
        return ops.cast(key_mask, "float32") * ops.cast(value_mask, "float32")
    return value_mask if key_mask is None else key_mask
