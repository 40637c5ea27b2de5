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

import contextlib
import contextvars
import dataclasses

import keras
from keras import ops

from layers.softmax_attention import softmax_attention

SCORES = ("dot", "scaled_dot", "additive")
NORMALIZATIONS = ("softmax", "relu")

# How far below a row's lowest score the full path puts masked scores.
_MASK_MARGIN = 20.0


@dataclasses.dataclass(frozen=True, eq=False)
class Weighting:
    """How scores become weights, as every attention path takes it: `score`
    (one of `SCORES`), `normalize` (one of `NORMALIZATIONS`), the additive
    `score_vector` (`[H, d]`, or `[d]` without the head axis), and the
    optional `dropout` layer on the weights with the call's `training`."""

    score: str = "scaled_dot"
    normalize: str = "softmax"
    score_vector: object = None
    dropout: object = None
    training: object = None

    @classmethod
    def of(cls, layer, training):
        """The weighting of an attention layer (`score`, `normalize`, its
        `score_vector` when additive, its dropout) for one call."""
        score_vector = getattr(layer, "score_vector", None)
        return cls(layer.score, layer.normalize, score_vector, layer._dropout_layer, training)

    @property
    def dropping(self):
        """Whether dropout on the weights is active in this call (`dropout` is
        `None` at rate 0, see `weights_dropout`)."""
        training = self.training
        return self.dropout is not None and training is not None and training is not False

    @property
    def plain_softmax(self):
        """Dot-product scores, softmax weights and no active dropout."""
        return self.score != "additive" and self.normalize == "softmax" and not self.dropping


def clone_initializer(initializer):
    """A fresh copy of `initializer` for one more weight, as Keras's layers
    clone theirs (a seeded initializer then gives each weight its own values)."""
    return initializer.__class__.from_config(initializer.get_config())


def weights_dropout(layer):
    """The dropout on an attention layer's weights (its `dropout` rate and
    `seed`), or `None` when the rate is 0."""
    if not layer.dropout:
        return None
    return keras.layers.Dropout(layer.dropout, seed=layer.seed, dtype=layer.dtype_policy)


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


def normalize_scores(scores, mask, normalize="softmax"):
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


# `keras.ops.dot_product_attention` for plain softmax attention, by backend
# and device. JAX on GPU/TPU: cuDNN's (or Pallas') fused flash attention.
# JAX on CPU: its XLA form measured 1.1-1.5x slower than our einsum path
# (jitted forward+backward, B16 N256 and B4 N1024). TensorFlow: Keras's TF
# kernel is an unfused einsum-softmax, and our hand-written backward
# (`softmax_attention`) is the faster one on CPU (benchmarks/results.md).
# `forced_fused` overrides the choice inside a `with` block (tests, benchmarks); a
# context variable, so the override ends with its block and stays in its thread.
_FORCED = contextvars.ContextVar("forced_fused", default=None)


@contextlib.contextmanager
def forced_fused(on):
    """Inside the block, plain softmax attention takes `keras.ops.dot_product_attention`
    (`on=True`) or never does (`False`), whatever the backend and device."""
    token = _FORCED.set(bool(on))
    try:
        yield
    finally:
        _FORCED.reset(token)


def fused_enabled():
    """Whether plain softmax attention runs `keras.ops.dot_product_attention`."""
    if _FORCED.get() is not None:
        return _FORCED.get()
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")


def takes_fused(weighting, need_weights):
    """Whether attention can run `keras.ops.dot_product_attention`: dot-product
    softmax scores, weights not returned, no active dropout on them, and a
    backend where it is the fastest path (`fused_enabled`)."""
    return fused_enabled() and not need_weights and weighting.plain_softmax


def fused_window(window, causal, dtype):
    """How JAX's kernel applies a local window itself, or `None` to keep it in
    the explicit mask.

    `jax.nn.dot_product_attention(local_window_size=(left, right))` keeps the
    keys `j` with `i - left <= j <= i + right`, both bounds inclusive, queries
    and keys counted from 0 (jax 0.10's `_get_window_mask`); our window keeps
    `|i - j| <= window`, and with `causal` also `j <= i`
    (`masks.position_mask`): `(window, window)`, or `(window, 0)` with
    `is_causal`. That is the same mask only where queries and keys are the
    same positions and a query may attend to itself (callers check
    `aligned` and `include_self`). cuDNN keeps only a left window (its
    `sliding_window_length = left + 1`, exclusive, with its causal mask) and
    only in float16/bfloat16: on GPUs a causal window in those dtypes runs
    `"cudnn"`; a symmetric one keeps the explicit mask that Keras's
    `dot_product_attention` hands to cuDNN, as on TPUs. Elsewhere (JAX's
    CPU backend when `forced_fused` forces the fused path) it runs `"xla"`.

    Returns:
        `None`, or `((left, right), implementation)`.
    """
    if keras.backend.backend() != "jax":
        return None
    import jax

    platform = jax.default_backend()
    if platform == "cpu":
        return (window, 0 if causal else window), "xla"
    if platform not in ("gpu", "cuda", "rocm") or not causal:
        return None
    half = keras.backend.standardize_dtype(dtype) in ("float16", "bfloat16")
    return (window, 0), "cudnn" if half else "xla"


def _jax_local_attention(query, key, value, mask, is_causal, local_window):
    """`jax.nn.dot_product_attention` with its own window (see `fused_window`);
    cuDNN's refusals (head size, odd lengths with a mask) fall back to its
    XLA form, as Keras's `dot_product_attention` does."""
    import jax

    (left, right), implementation = local_window
    kwargs = dict(mask=mask, scale=1.0, is_causal=is_causal, local_window_size=(left, right))
    if implementation == "cudnn":
        try:
            return jax.nn.dot_product_attention(query, key, value, implementation="cudnn", **kwargs)
        except (NotImplementedError, ValueError, RuntimeError):
            pass
    return jax.nn.dot_product_attention(query, key, value, implementation="xla", **kwargs)


def fused_context(query, key, value, mask, is_causal=False, local_window=None):
    """`keras.ops.dot_product_attention` in the `attention_context` layout.

    `query` is already scaled (scale 1). `mask`: `None` or 0/1 broadcastable
    to `[B, 1, Tq, Tk]` (`[B, Tq, Tk]` without the head axis). Fully masked
    rows come out as a uniform mix of values; callers zero them (one rule on
    every path), and their zeroed output sends them no gradient.
    `local_window`: `None`, or what `fused_window` returned (JAX only): the
    window is the kernel's, not part of `mask`.
    """
    single = len(query.shape) == 3
    if single:
        query, key, value = (ops.expand_dims(t, 2) for t in (query, key, value))
    if mask is not None:
        mask = ops.expand_dims(mask, 1)  # [B|1, 1, Tq, Tk]
        shape = (ops.shape(query)[0], 1, ops.shape(query)[1], ops.shape(key)[1])
        mask = ops.broadcast_to(ops.cast(mask, "float32") > 0.5, shape)
    if local_window is not None:
        context = _jax_local_attention(query, key, value, mask, is_causal, local_window)
    else:
        context = ops.dot_product_attention(
            query, key, value, mask=mask, scale=1.0, is_causal=is_causal
        )
    return context[:, :, 0] if single else context


def takes_softmax_backward(weighting, need_weights):
    """Whether attention can run through `softmax_attention`'s hand-written
    backward: dot-product softmax scores, weights not returned, no active
    dropout on them, and not traced for XLA (see `compiled_by_xla`)."""
    return not need_weights and weighting.plain_softmax and not compiled_by_xla()


def query_has_keys(mask):
    """`[B|1, Tq, 1]` float: 1 where a query row may attend to something.

    A float max rather than `any`: REDUCE_ANY has no mobile GPU kernel (and the
    cast is a no-op for `combine_masks`' float masks)."""
    return ops.max(ops.cast(mask, "float32"), axis=-1, keepdims=True)


def attention_context(query, key, value, mask, weighting, *, need_weights=True):
    """Scores, normalises and mixes values: the full path, unless `takes_fused`.

    Args:
        query: `[B, Tq, H, d]`, already projected (and scaled if the caller
            wants `scaled_dot`).
        key: `[B, Tk, H, d]`.
        value: `[B, Tk, H, dv]`.
        mask: `None` or boolean `[B|1, Tq, Tk]`.
        weighting: a `Weighting`.
        need_weights: bool; with `False`, dot-product softmax attention
            without active dropout and outside XLA takes
            `softmax_attention`'s faster backward and returns `None` for the
            weights.

    Returns:
        `(context [B, Tq, H, dv], weights [B, H, Tq, Tk] float32)`; the
        weights are returned before dropout. Without the head axis (one head,
        rank 3) the context is `[B, Tq, dv]` and the weights `[B, Tq, Tk]`.
    """
    per_head = len(query.shape) == 4
    head_mask = mask if mask is None or not per_head else ops.expand_dims(mask, 1)
    if takes_softmax_backward(weighting, need_weights):
        return softmax_attention(query, key, value, head_mask, normalize_scores), None
    if weighting.score == "additive":
        scores = additive_scores(query, key, weighting.score_vector)
    else:
        scores = ops.einsum("bqhd,bkhd->bhqk" if per_head else "bqd,bkd->bqk", query, key)
    weights = normalize_scores(scores, head_mask, weighting.normalize)
    mixed = weights
    if weighting.dropout is not None:
        mixed = weighting.dropout(weights, training=weighting.training)
    mixed = ops.cast(mixed, value.dtype)
    context = ops.einsum("bhqk,bkhd->bqhd" if per_head else "bqk,bkd->bqd", mixed, value)
    return context, weights


def without_keras_mask(x):
    """`x` without its attached Keras mask, so that projection sub-layers
    (which do not support masking) neither warn nor drop it; the attention
    layer handles masks itself. A copy (tf.identity) is free after graph optimisation
    and, unlike deleting the attribute, leaves the caller's tensor intact."""
    if x is None or getattr(x, "_keras_mask", None) is None:
        return x
    return ops.copy(x)
