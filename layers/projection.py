"""Linear projections of `[B, T, C]` sequences laid out for fast matmuls.

Under TensorFlow, `EinsumDense`'s `[B, T, C] x [C, H, d]` is a broadcasting
BatchMatMulV2 whose kernel gradient is B products summed afterwards.
`flat_matmul` does the same arithmetic as one `[B*T, C] x [C, H*d]` GEMM.
`heads_first_projection` goes one step further for attention, which works
per head: it projects straight into `[H, B, T, d]`, where every head's
queries, keys and values are contiguous, so no transpose or split sits
between the projection and the attention products.
"""

import math
from itertools import accumulate

from keras import ops


def flat_matmul(x, kernel, bias=None, in_rank=1):
    """`[B, T, *in] x [*in, *out] (+ bias [*out]) -> [B, T, *out]` as one
    `[B*T, prod(in)] x [prod(in), prod(out)]` matmul."""
    in_size = math.prod(kernel.shape[:in_rank])
    out_dims = tuple(kernel.shape[in_rank:])
    out_size = math.prod(out_dims)
    flat = ops.matmul(ops.reshape(x, (-1, in_size)), ops.reshape(kernel, (in_size, out_size)))
    if bias is not None:
        flat = flat + ops.reshape(bias, (out_size,))
    return ops.reshape(flat, (-1, _steps(x)) + out_dims)


def _steps(x):
    return x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]


def heads_first_projection(x, kernels, biases=None):
    """Projects `x` `[B, T, C]` by kernels `[C, H, d]` (Keras's layout) into
    `[H, B, T, d]` each.

    All kernels go through one batched matmul `[1, B*T, C] x [G, C, d]`
    (`G` = total heads; the biases ride along as one more input row). Its
    hand-written gradient keeps the input's gradient a single
    `[B*T, G*d] x [G*d, C]` GEMM (autodiff would build `[G, B*T, C]` and sum
    it over heads); in a TensorFlow function that part is pruned when nothing
    needs it.

    Args:
        x: `[B, T, C]`.
        kernels: list of `[C, H_i, d]` kernels, same `d`.
        biases: `None` or a list of `[H_i, d]` biases.

    Returns:
        A list of `[H_i, B, T, d]` tensors, one per kernel.
    """
    channels = x.shape[-1]
    heads = [k.shape[1] for k in kernels]
    depth = kernels[0].shape[2]
    # [C, H, d] -> [H, C, d]: transposes of the (small) weights only.
    kernels = [ops.transpose(k, (1, 0, 2)) for k in kernels]
    batch, steps = ops.shape(x)[0], _steps(x)
    flat = ops.reshape(x, (-1, channels))
    if biases is not None:
        # The bias as one more input row: x [B*T, C+1] with a column of ones,
        # kernel [H, C+1, d]; the matmul adds it and its gradient comes out
        # of the kernel's, with no separate pass over [H, B*T, d] either way.
        kernels = [
            ops.concatenate([k, ops.expand_dims(b, 1)], axis=1) for k, b in zip(kernels, biases)
        ]
        flat = ops.concatenate([flat, ops.ones_like(flat[:, :1])], axis=-1)
    count = len(kernels)

    @ops.custom_gradient
    def project(flat, *kernels):
        kernel = ops.concatenate(kernels, axis=0)
        out = ops.matmul(ops.expand_dims(flat, 0), kernel)
        # Splitting the outermost axis shares the buffer; the gradient below
        # takes the parts one by one, so no concatenation of [H, B*T, d]
        # gradients is needed for the kernels either.
        outs = ops.split(out, list(accumulate(heads))[:-1], axis=0) if count > 1 else [out]

        def grad(*args, upstream=None):
            d_outs = args if upstream is None else upstream
            flat_t = ops.expand_dims(ops.transpose(flat), 0)
            d_kernels = tuple(ops.matmul(flat_t, d) for d in d_outs)
            token_major = ops.concatenate(
                [
                    ops.reshape(ops.transpose(d, (1, 0, 2)), (-1, h * depth))
                    for d, h in zip(d_outs, heads)
                ],
                axis=-1,
            )
            d_flat = ops.matmul(
                token_major,
                ops.reshape(ops.transpose(kernel, (0, 2, 1)), (-1, kernel.shape[1])),
            )
            return (d_flat,) + d_kernels

        return tuple(outs), grad

    projected = project(flat, *kernels)
    return [ops.reshape(p, (h, batch, steps, depth)) for p, h in zip(projected, heads)]
