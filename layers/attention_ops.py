"""The attention computation shared by `SelfAttention` and `MultiHeadAttention`.

Tensors are laid out per head: queries `[B, Tq, H, d]`, keys `[B, Tk, H, d]`,
values `[B, Tk, H, dv]`, scores and weights `[B, H, Tq, Tk]` (rank <= 4 for the
dot-product scores, which the mobile GPU delegate needs). A single head may
drop the head axis (`[B, T, d]`, weights `[B, Tq, Tk]`): squeezing it out
afterwards does not convert to TFLite with dynamic shapes.

One rule for fully masked query rows, on every path: their attention weights
are all zero, so their context vector is zero (the layers then also zero their
output). Keras's own layer gives uniform weights on one path and zeros on
another (FACTS.md).
"""

from keras import ops

SCORES = ("dot", "scaled_dot", "additive")
NORMALIZATIONS = ("softmax", "relu")

# Added to masked scores before the softmax. Kept in float32 (the softmax always
# runs in float32), where -1e9 is representable; in float16 it would be -inf.
_MASK_PENALTY = -1e9


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
        mask: `None` or boolean mask broadcastable to `[B, 1, Tq, Tk]`.
        normalize: `"softmax"` or `"relu"` (`alpha' = relu(alpha)`, no
            renormalisation, as in the lecture notes).

    Returns:
        float32 weights of the scores' shape; exactly zero where masked.
    """
    scores = ops.cast(scores, "float32")
    keep = None if mask is None else ops.cast(mask, "float32")
    if normalize == "softmax":
        if keep is not None:
            scores = scores + (1.0 - keep) * _MASK_PENALTY
        weights = ops.softmax(scores, axis=-1)
    else:
        weights = ops.relu(scores)
    if keep is not None:
        weights = weights * keep
    return weights


def weighted_sum(weights, value):
    """`[B, H, Tq, Tk] x [B, Tk, H, dv] -> [B, Tq, H, dv]`; without the head
    axis `[B, Tq, Tk] x [B, Tk, dv] -> [B, Tq, dv]`."""
    if len(value.shape) == 3:
        return ops.einsum("bqk,bkd->bqd", weights, value)
    return ops.einsum("bhqk,bkhd->bqhd", weights, value)


def query_has_keys(mask):
    """`[B|1, Tq, 1]` float: 1 where a query row may attend to something."""
    return ops.cast(ops.any(ops.cast(mask, "bool"), axis=-1, keepdims=True), "float32")


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
):
    """Scores, normalises and mixes values; the one path every layer uses.

    Args:
        query: `[B, Tq, H, d]`, already projected (and scaled if the caller
            wants `scaled_dot`: scaling the query like Keras does keeps
            results bit-compatible with `keras.layers.MultiHeadAttention`).
        key: `[B, Tk, H, d]`.
        value: `[B, Tk, H, dv]`.
        mask: `None` or boolean `[B|1, Tq, Tk]`.
        score: one of `SCORES`.
        normalize: one of `NORMALIZATIONS`.
        score_vector: `[H, d]` for `score="additive"`.
        dropout: optional dropout layer applied to the weights.
        training: passed to `dropout`.

    Returns:
        `(context [B, Tq, H, dv], weights [B, H, Tq, Tk] float32)`; the
        weights are returned before dropout.
    """
    if score == "additive":
        scores = additive_scores(query, key, score_vector)
    else:
        scores = dot_scores(query, key)
    per_head = len(query.shape) == 4
    head_mask = mask if mask is None or not per_head else ops.expand_dims(mask, 1)
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
