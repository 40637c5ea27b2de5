"""Dot-product softmax attention with a hand-written backward pass.

Autodiff of `softmax(Q K^T) V` differentiates the softmax on its own: the
gradient of every `[Tq, Tk]` weight row needs `sum_k dW * W`, an extra pass
over the quadratic tensor. With the output `O = W V` at hand the same sum is
`sum_d dO * O` (flash-attention's `D` term), a pass over `[Tq, d]` instead;
the weights' gradient becomes `dS = W * (dO V^T - D)`. The rows of `W` may be
masked (zeroed after the softmax, see `attention_ops.normalize_scores`): the
formula still holds because `O` is built from the masked weights, and masked
entries get `dS = 0` because their weight is 0.

Work happens head-major (`[B, H, T, d]`), where every product is a plain
batched matmul; TensorFlow's einsum would transpose the `[B, T, H, d]`
operands again for each of the six products of forward and backward.
"""

from keras import ops


def head_major(x):
    """`[B, T, H, d]` <-> `[B, H, T, d]`; rank 3 (no head axis) unchanged."""
    return x if len(x.shape) == 3 else ops.transpose(x, (0, 2, 1, 3))


def transpose_last(x):
    """Swaps the last two axes."""
    rank = len(x.shape)
    return ops.transpose(x, tuple(range(rank - 2)) + (rank - 1, rank - 2))


def softmax_attention(query, key, value, keep, normalize_scores, heads_first=False):
    """`softmax(q k^T) v` with masked weights, in the `attention_ops` layout.

    Args:
        query: `[B, Tq, H, d]` (or `[B, Tq, d]` without the head axis).
        key: `[B, Tk, H, d]` (or `[B, Tk, d]`).
        value: `[B, Tk, H, dv]` (or `[B, Tk, dv]`).
        keep: `None` or 0/1 mask (float or boolean) broadcastable to the weights
            `[B, 1, Tq, Tk]` (or `[B, Tq, Tk]`); constant for the gradient.
        normalize_scores: the function turning float scores and `keep` into
            float32 weights (`attention_ops.normalize_scores`, softmax by
            default), so that both paths share one forward.
        heads_first: bool; with `True` the operands already are
            `[H, B, T, d]` (see `projection.heads_first_projection`), `keep`
            broadcasts to `[1, B, Tq, Tk]`, and the context is returned in
            the same layout, without any transpose.

    Returns:
        The context `[B, Tq, H, dv]` (or `[B, Tq, dv]`) in the value dtype.
    """
    per_head = len(query.shape) == 4 and not heads_first
    q, k, v = (head_major(t) for t in (query, key, value)) if per_head else (query, key, value)

    @ops.custom_gradient
    def attend(q, k, v):
        weights = normalize_scores(ops.matmul(q, transpose_last(k)), keep)
        out = ops.matmul(ops.cast(weights, v.dtype), v)

        def grad(*args, upstream=None):
            d_out = args[0] if upstream is None else upstream
            d_out = ops.cast(d_out, v.dtype)
            d_v = ops.matmul(transpose_last(ops.cast(weights, v.dtype)), d_out)
            row = ops.sum(
                ops.cast(d_out, "float32") * ops.cast(out, "float32"), axis=-1, keepdims=True
            )
            # `dO V^T - D` as one product of operands widened by a column,
            # [dO, -D] [V, 1]^T: no separate pass over the [Tq, Tk] tensor.
            d_weights = ops.matmul(
                ops.concatenate([d_out, ops.cast(-row, v.dtype)], axis=-1),
                transpose_last(ops.concatenate([v, ops.ones_like(v[..., :1])], axis=-1)),
            )
            d_scores = ops.cast(weights * ops.cast(d_weights, "float32"), q.dtype)
            d_q = ops.matmul(d_scores, k)
            d_k = ops.matmul(transpose_last(d_scores), q)
            return d_q, d_k, d_v

        return out, grad

    context = attend(q, k, v)
    return head_major(context) if per_head else context
