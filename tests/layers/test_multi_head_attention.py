"""MultiHeadAttention against keras.layers.MultiHeadAttention and NumPy."""

import keras
import numpy as np
import pytest

from layers import MultiHeadAttention
from tests.support.attention_reference import allowed_matrix, normalise_row

RNG = np.random.default_rng(3)


def _pair(num_heads=2, key_dim=4, query_dim=8, value_dim=6, **ours_kwargs):
    """Our layer and Keras's, built on the same shapes, weights copied over."""
    q = RNG.normal(size=(3, 5, query_dim)).astype("float32")
    v = RNG.normal(size=(3, 7, value_dim)).astype("float32")
    ours = MultiHeadAttention(num_heads=num_heads, key_dim=key_dim, **ours_kwargs)
    ref = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim)
    ours(q, v)
    ref(q, v)
    for name in ("query", "key", "value", "output"):
        getattr(ours, f"{name}_dense").set_weights(getattr(ref, f"_{name}_dense").get_weights())
    return ours, ref, q, v


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def test_cross_attention_equals_keras_with_copied_weights():
    ours, ref, q, v = _pair()
    out, scores = ours(q, v, return_attention_scores=True)
    ref_out, ref_scores = ref(q, v, return_attention_scores=True)
    assert _max_diff(out, ref_out) <= 1e-5
    assert _max_diff(scores, ref_scores) <= 1e-5


def test_self_attention_with_key_padding_equals_keras():
    ours, ref, _, _ = _pair(value_dim=8)
    x = RNG.normal(size=(3, 7, 8)).astype("float32")
    value_mask = np.array([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5], bool)
    out = ours(x, x, value_mask=value_mask)
    ref_out = ref(x, x, value_mask=value_mask)
    assert _max_diff(out, ref_out) <= 1e-5


def test_causal_equals_keras_use_causal_mask():
    ours, ref, _, _ = _pair(value_dim=8, causal=True)
    x = RNG.normal(size=(3, 7, 8)).astype("float32")
    assert _max_diff(ours(x, x), ref(x, x, use_causal_mask=True)) <= 1e-5


def test_explicit_query_mask_is_honoured_and_masked_rows_are_zero():
    ours, ref, q, v = _pair()
    query_mask = np.array([[1, 1, 1, 0, 0]] * 3, bool)
    out = np.asarray(ours(q, v, query_mask=query_mask))
    unmasked = np.asarray(ours(q, v))
    np.testing.assert_allclose(out[:, :3], unmasked[:, :3], atol=1e-6)
    assert np.all(out[:, 3:] == 0.0)
    # Keras ignores the explicit query mask (docs/facts.md): its rows 3-4 are not zero.
    assert np.abs(np.asarray(ref(q, v, query_mask=query_mask))[:, 3:]).max() > 0


def test_fully_masked_rows_same_on_every_path():
    ours, _, q, v = _pair(dropout=0.3)
    attention_mask = np.ones((3, 5, 7), bool)
    attention_mask[:, 1] = False
    plain = np.asarray(ours(q, v, attention_mask=attention_mask))
    with_scores, scores = ours(q, v, attention_mask=attention_mask, return_attention_scores=True)
    trained = np.asarray(ours(q, v, attention_mask=attention_mask, training=True))
    for result in (plain, np.asarray(with_scores), trained):
        assert np.all(result[:, 1] == 0.0)
    assert np.all(np.asarray(scores)[:, :, 1] == 0.0)
    np.testing.assert_allclose(plain, np.asarray(with_scores), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "score,normalize", [("dot", "relu"), ("additive", "softmax"), ("scaled_dot", "softmax")]
)
@pytest.mark.parametrize("options", [dict(), dict(window=1, include_self=False)])
def test_matches_numpy_per_head(score, normalize, options):
    q = RNG.normal(size=(2, 6, 5)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=3, score=score, normalize=normalize, **options)
    out, weights = layer(q, return_attention_scores=True)
    wq, bq = [np.asarray(w) for w in layer.query_dense.get_weights()]
    wk, bk = [np.asarray(w) for w in layer.key_dense.get_weights()]
    wv, bv = [np.asarray(w) for w in layer.value_dense.get_weights()]
    wo, bo = [np.asarray(w) for w in layer.output_dense.get_weights()]
    allowed = allowed_matrix(6, 6, **options)
    for b in range(2):
        heads = []
        for h in range(2):
            qh = q[b] @ wq[:, h] + bq[h]
            kh = q[b] @ wk[:, h] + bk[h]
            vh = q[b] @ wv[:, h] + bv[h]
            if score == "additive":
                w = np.asarray(layer.score_vector)[h]
                alpha = np.array([[w @ np.tanh(qh[i] + kh[j]) for j in range(6)] for i in range(6)])
            else:
                alpha = qh @ kh.T / (np.sqrt(3) if score == "scaled_dot" else 1.0)
            a = np.stack([normalise_row(alpha[i], allowed[i], normalize) for i in range(6)])
            np.testing.assert_allclose(np.asarray(weights[b, h]), a, atol=1e-5)
            heads.append(a @ vh)
        ref = np.einsum("thd,hde->te", np.stack(heads, 1), wo) + bo
        np.testing.assert_allclose(np.asarray(out[b]), ref, atol=1e-5)


def _length_scaled_reference(layer, q, v, allowed, length_scale):
    """NumPy: each query's scaled dot products times max(1, ln n / ln length_scale),
    n its allowed keys, then the masked softmax, per head and example."""
    wq, bq, wk, bk, wv, bv, wo, bo = (
        np.asarray(w)
        for d in ("query", "key", "value", "output")
        for w in getattr(layer, f"{d}_dense").get_weights()
    )
    out = []
    for b in range(q.shape[0]):
        heads = []
        for h in range(wq.shape[1]):
            qh, kh, vh = q[b] @ wq[:, h] + bq[h], v[b] @ wk[:, h] + bk[h], v[b] @ wv[:, h] + bv[h]
            alpha = qh @ kh.T / np.sqrt(wq.shape[2])
            rows = []
            for i, row in enumerate(allowed[b]):
                factor = max(1.0, np.log(max(row.sum(), 1)) / np.log(length_scale))
                rows.append(normalise_row(alpha[i] * factor, row, "softmax"))
            heads.append(np.stack(rows) @ vh)
        out.append(np.einsum("thd,hde->te", np.stack(heads, 1), wo) + bo)
    return np.stack(out)


@pytest.mark.parametrize("cached", [False, True])
def test_length_scale_matches_numpy_cross_attention(cached):
    # Keys 7, 5 and 2 per example against length_scale 3: scaled, scaled, unchanged.
    q = RNG.normal(size=(3, 4, 8)).astype("float32")
    v = RNG.normal(size=(3, 7, 6)).astype("float32")
    key_mask = np.array([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5], bool)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, length_scale=3)
    plain = MultiHeadAttention(num_heads=2, key_dim=4)
    out = layer(q, v, value_mask=key_mask)
    plain(q, v)
    plain.set_weights(layer.get_weights())
    if cached:
        out = layer(q, cache=layer.compute_cache(v), value_mask=key_mask)[0]
    allowed = np.stack([allowed_matrix(4, 7, key_mask=m) for m in key_mask])
    ref = _length_scaled_reference(layer, q, v, allowed, 3)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)
    # Within length_scale keys (example 2) it is the plain layer; beyond, it is not.
    unscaled = np.asarray(plain(q, v, value_mask=key_mask))
    np.testing.assert_allclose(np.asarray(out)[2], unscaled[2], atol=1e-5)
    assert _max_diff(np.asarray(out)[:2], unscaled[:2]) > 1e-3


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_length_scale_matches_numpy_causal_and_cache(chunk_size):
    # Causal: query i sees i + 1 keys; the same by cached steps and block by block.
    x = RNG.normal(size=(2, 9, 8)).astype("float32")
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, causal=True, length_scale=2, chunk_size=chunk_size
    )
    full = np.asarray(layer(x))
    allowed = np.stack([allowed_matrix(9, 9, causal=True)] * 2)
    np.testing.assert_allclose(full, _length_scaled_reference(layer, x, x, allowed, 2), atol=1e-5)
    cache = np.zeros((2, 2, 9, 2, 4), "float32")
    steps = []
    for t in range(9):
        y, cache = layer(x[:, t : t + 1], cache=cache, cache_index=t)
        steps.append(np.asarray(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_symbolic_cross_attention_score_shape():
    layer = MultiHeadAttention(num_heads=3, key_dim=4)
    out, scores = layer(keras.Input((5, 8)), keras.Input((7, 6)), return_attention_scores=True)
    assert tuple(out.shape) == (None, 5, 8)
    assert tuple(scores.shape) == (None, 3, 5, 7)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [dict(causal=True), dict(causal=True, window=2), dict(causal=True, rotary=True)]
)
@pytest.mark.parametrize("step", [1, 3])
def test_cache_equals_full_recomputation(options, step):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, **options)
    x = RNG.normal(size=(2, 9, 8)).astype("float32")
    full = np.asarray(layer(x))
    cache = np.zeros((2, 2, 9, 2, 4), "float32")
    pieces = []
    for start in range(0, 9, step):
        y, cache = layer(x[:, start : start + step], cache=cache, cache_index=start)
        pieces.append(np.asarray(y))
        np.testing.assert_allclose(np.concatenate(pieces, 1), full[:, : start + step], atol=1e-5)


@pytest.mark.parametrize("options", [dict(causal=True), dict(causal=True, rotary=True)])
def test_split_cache_equals_full_recomputation(options):
    # The rank-4 (key_cache, value_cache) form that GPU exports use.
    layer = MultiHeadAttention(num_heads=2, key_dim=4, **options)
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    full = np.asarray(layer(x))
    cache = (np.zeros((2, 6, 2, 4), "float32"), np.zeros((2, 6, 2, 4), "float32"))
    for i in range(6):
        y, cache = layer(x[:, i : i + 1], cache=cache, cache_index=i)
        assert isinstance(cache, tuple) and len(cache) == 2
        np.testing.assert_allclose(np.asarray(y), full[:, i : i + 1], atol=1e-5)
    # The written keys are the layer's own key projection of x.
    want_keys = np.einsum("btf,fhd->bthd", x, np.asarray(layer.key_dense.kernel))
    want_keys = want_keys + np.asarray(layer.key_dense.bias)
    if not options.get("rotary"):
        np.testing.assert_allclose(np.asarray(cache[0]), want_keys, atol=1e-5)


@pytest.mark.parametrize(
    "cache,pattern",
    [
        ((np.zeros((1, 5, 2, 4)),), r"pair .*1 tensors"),
        ((np.zeros((1, 5, 2, 4)), np.zeros((1, 5, 3, 4))), r"cache \(value_cache\)"),
        ((np.zeros((1, 5, 2, 4)), np.zeros((1, 6, 2, 4))), r"same length"),
    ],
)
def test_bad_split_cache_names_the_argument(cache, pattern):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, causal=True)
    cache = tuple(c.astype("float32") for c in cache)
    with pytest.raises(ValueError, match=pattern):
        layer(np.zeros((1, 1, 8), "float32"), cache=cache, cache_index=0)


def test_cross_attention_cache_equals_direct():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    q = RNG.normal(size=(2, 3, 8)).astype("float32")
    enc = RNG.normal(size=(2, 6, 8)).astype("float32")
    enc_mask = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    direct = np.asarray(layer(q, enc, value_mask=enc_mask))
    cache = layer.compute_cache(enc)
    cached, same_cache = layer(q, cache=cache, value_mask=enc_mask)
    np.testing.assert_allclose(np.asarray(cached), direct, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(same_cache), np.asarray(cache))
    keys, values = layer.compute_cache(enc, split=True)
    np.testing.assert_array_equal(np.asarray(keys), np.asarray(cache)[:, 0])
    split_out, _ = layer(q, cache=(keys, values), value_mask=enc_mask)
    np.testing.assert_allclose(np.asarray(split_out), direct, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(num_heads=0, key_dim=4), "num_heads"),
        (dict(num_heads=2, key_dim=0), "key_dim"),
        (dict(num_heads=2, key_dim=4, window=-3), "window"),
        (dict(num_heads=2, key_dim=4, score="cosine"), "score"),
        (dict(num_heads=2, key_dim=4, normalize="sparsemax"), "normalize"),
        (dict(num_heads=2, key_dim=4, dropout=-0.1), "dropout"),
        (dict(num_heads=2, key_dim=3, rotary=True), "key_dim"),
        (dict(num_heads=2, key_dim=4, length_scale=1), "length_scale"),
        (dict(num_heads=2, key_dim=4, length_scale=8, score="additive"), "length_scale"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}="):
        MultiHeadAttention(**kwargs)


def test_bad_shapes_name_the_input():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match=r"query\.shape=\(2, 8\)"):
        layer(np.zeros((2, 8), "float32"))
    with pytest.raises(ValueError, match=r"key\.shape=\(2, 4, 8\), value\.shape=\(2, 5, 8\)"):
        MultiHeadAttention(num_heads=2, key_dim=4)(
            np.zeros((2, 3, 8), "float32"),
            np.zeros((2, 5, 8), "float32"),
            np.zeros((2, 4, 8), "float32"),
        )
    with pytest.raises(ValueError, match=r"value_dim=8"):
        MultiHeadAttention(num_heads=2, key_dim=4, value_dim=8).compute_cache(
            np.zeros((1, 3, 8), "float32")
        )


@pytest.mark.slow
def test_self_attention_runs_heads_first_and_equals_the_token_major_path(monkeypatch):
    import tensorflow as tf

    import layers.multi_head_attention as mha

    calls = []
    real = mha.heads_first_projection
    monkeypatch.setattr(mha, "heads_first_projection", lambda *a: calls.append(1) or real(*a))
    layer = MultiHeadAttention(num_heads=2, key_dim=4, window=2, rotary=True)
    x = tf.constant(RNG.normal(size=(3, 6, 8)).astype("float32"))
    query_mask = np.array([[1] * 6, [1] * 2 + [0] * 4, [0] * 6], bool)

    def outputs_and_gradients():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, query_mask=query_mask)
            # Every output element weighs differently: no error can cancel.
            weights = tf.reshape(tf.cos(tf.range(tf.size(y), dtype=y.dtype)), tf.shape(y))
            loss = tf.reduce_sum(y * weights)
        return [np.asarray(t) for t in [y] + tape.gradient(loss, [x] + layer.trainable_variables)]

    heads_first = outputs_and_gradients()
    assert calls
    calls.clear()
    monkeypatch.setattr(MultiHeadAttention, "_heads_first", lambda self, *a: False)
    token_major = outputs_and_gradients()
    assert not calls
    for a, b in zip(heads_first, token_major):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    monkeypatch.undo()

    # Paths that need [B, T, H, d] (scores out, the cache, chunks) stay off it.
    monkeypatch.setattr(mha, "heads_first_projection", lambda *a: calls.append(1) or real(*a))
    layer(x, return_attention_scores=True)
    layer(x[:, :1], cache=np.zeros((3, 2, 6, 2, 4), "float32"), cache_index=0)
    MultiHeadAttention(num_heads=2, key_dim=4, chunk_size=4)(x)
    assert not calls


class _MeanValues(MultiHeadAttention):
    """Overrides only the attention stage: every query gets the mean of the
    values over the keys that are not padding (uniform weights)."""

    def _compute_attention(self, query, key, value, query_mask=None, key_mask=None, **kwargs):
        keep = keras.ops.ones(keras.ops.shape(value)[:2]) if key_mask is None else key_mask
        keep = keras.ops.cast(keep, value.dtype)[:, :, None, None]  # [B, Tk, 1, 1]
        mean = keras.ops.sum(value * keep, axis=1, keepdims=True) / keras.ops.sum(
            keep, axis=1, keepdims=True
        )
        context = keras.ops.broadcast_to(
            mean, (keras.ops.shape(query)[0], keras.ops.shape(query)[1], *value.shape[2:])
        )
        return context, None, None


@pytest.mark.parametrize("cross", [False, True])
def test_compute_attention_is_the_override_point(cross):
    """`call` runs a subclass's `_compute_attention` between the layer's own
    projections, on every path (self-attention would otherwise take the fused
    heads-first path): the output is the NumPy output projection of the
    per-head mean of the projected values."""
    layer = _MeanValues(num_heads=2, key_dim=4)
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    source = RNG.normal(size=(2, 6, 7)).astype("float32") if cross else x
    key_mask = np.ones((2, source.shape[1]), bool)
    key_mask[1, 3:] = False
    y = np.asarray(
        layer(x, source, value_mask=key_mask) if cross else layer(x, query_mask=key_mask)
    )

    wv, bv = layer.value_dense.get_weights()  # [C, H, dv], [H, dv]
    wo, bo = layer.output_dense.get_weights()  # [H, dv, D], [D]
    values = np.einsum("btc,chd->bthd", source, wv) + bv
    weights = key_mask[:, :, None, None].astype("float32")
    mean = (values * weights).sum(1) / weights.sum(1)  # [B, H, dv]
    want = np.einsum("bhd,hde->be", mean, wo) + bo
    np.testing.assert_allclose(y, np.broadcast_to(want[:, None], y.shape), atol=1e-5)

    plain = MultiHeadAttention(num_heads=2, key_dim=4)
    plain(x, source)
    plain.set_weights(layer.get_weights())
    assert _max_diff(plain(x, source), y) > 1e-2  # the override changed the result
    # Self-attention's fused heads-first path is the plain layer's only.
    assert plain._heads_first(True, None, False, None, None)
    assert not layer._heads_first(True, None, False, None, None)
