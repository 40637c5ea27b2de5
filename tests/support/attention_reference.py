"""Plain NumPy attention written from the lecture formulas, loop by loop.

It shares no code with layers/: it is the independent reference the layer
tests compare against.
"""

import numpy as np


def allowed_matrix(
    length_q,
    length_k,
    *,
    causal=False,
    window=None,
    include_self=True,
    query_mask=None,
    key_mask=None,
    offset=0,
):
    """allowed[i, j] is True when query i may attend to key j."""
    allowed = np.ones((length_q, length_k), bool)
    for i in range(length_q):
        pos_i = i + offset
        for j in range(length_k):
            if causal and j > pos_i:
                allowed[i, j] = False
            if window is not None and abs(pos_i - j) > window:
                allowed[i, j] = False
            if not include_self and pos_i == j:
                allowed[i, j] = False
            if query_mask is not None and not query_mask[i]:
                allowed[i, j] = False
            if key_mask is not None and not key_mask[j]:
                allowed[i, j] = False
    return allowed


def normalise_row(alpha, allowed_row, normalize):
    out = np.zeros_like(alpha)
    if not allowed_row.any():
        return out
    if normalize == "softmax":
        vals = alpha[allowed_row]
        e = np.exp(vals - vals.max())
        out[allowed_row] = e / e.sum()
    else:  # relu
        out[allowed_row] = np.maximum(alpha[allowed_row], 0.0)
    return out


def single_head(
    a,
    wq,
    wk,
    wv,
    *,
    bq=None,
    bk=None,
    bv=None,
    score="scaled_dot",
    w=None,
    normalize="softmax",
    allowed=None,
):
    """b^i = sum_j alpha'_{i,j} v^j for one sequence a [T, D]."""
    a = a.astype(np.float64)
    q = a @ wq + (0 if bq is None else bq)
    k = a @ wk + (0 if bk is None else bk)
    v = a @ wv + (0 if bv is None else bv)
    t = a.shape[0]
    if allowed is None:
        allowed = np.ones((t, t), bool)
    alpha = np.zeros((t, t))
    for i in range(t):
        for j in range(t):
            if score == "dot":
                alpha[i, j] = q[i] @ k[j]
            elif score == "scaled_dot":
                alpha[i, j] = q[i] @ k[j] / np.sqrt(q.shape[-1])
            else:
                alpha[i, j] = w @ np.tanh(q[i] + k[j])
    weights = np.stack([normalise_row(alpha[i], allowed[i], normalize) for i in range(t)])
    return weights @ v, weights
