"""Cached decoding (static KV cache, while_loop, XLA) against a full-recompute
reference written here: every step's logits, greedy tokens, beam search."""

import keras
import numpy as np
import pytest

import zoo
from zoo.seq2seq import decoding, samplers
from zoo.seq2seq.tokenization import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

VOCAB = 24
LENGTH = 10
CONFIGS = {
    "preln-sinusoidal-shared": ("seq2seq", dict(num_layers=2)),
    "postln-learned-separate-window": (
        "seq2seq",
        dict(num_layers=2, norm_first=False, position="learned", share_embeddings=False, window=2),
    ),
    "universal": ("universal_transformer", dict(num_steps=3)),
    "universal-act": ("universal_transformer", dict(num_steps=3, act=True, act_threshold=0.9)),
}


_TRAINED = {}


def _model(name, seed=0, **overrides):
    kind, kwargs = CONFIGS[name]
    keras.utils.set_random_seed(seed)
    options = dict(hidden_dim=32, num_heads=4, intermediate_dim=64, dropout=0.0)
    options.update(max_source_length=16, max_target_length=LENGTH, **kwargs)
    return zoo.build(kind, vocabulary_size=VOCAB, **options | overrides)


def train_on_reversal(model, n, epochs, warmup, vocab=VOCAB):
    """Trains `model` briefly to reverse `n` random id rows (2 to 7 ids of
    `4..vocab-1`); returns their source array `[n, 8]`."""
    from train.seq2seq.fit import compile_seq2seq

    rng = np.random.default_rng(0)
    src = np.zeros((n, 8), "int32")
    tgt_in = np.zeros((n, LENGTH), "int32")
    tgt_out = np.zeros((n, LENGTH), "int32")
    for i, k in enumerate(rng.integers(2, 8, n)):
        row = rng.integers(4, vocab, k)
        src[i, :k] = row
        tgt_in[i, : k + 1] = [BOS_ID, *row[::-1]]
        tgt_out[i, : k + 1] = [*row[::-1], EOS_ID]
    compile_seq2seq(model, 3e-3, warmup, 0.0, jit_compile=False)
    model.fit(
        {"source_ids": src, "target_ids": tgt_in}, tgt_out, batch_size=64, epochs=epochs, verbose=0
    )
    return src


def _trained(name):
    """A briefly trained model (reverse a sequence of ids): untrained models
    repeat one token, which would make token comparisons pass trivially.
    Half-trained is what we want: varied tokens, EOS sometimes, near-ties rare."""
    if name not in _TRAINED:
        _TRAINED[name] = _model(name)
        train_on_reversal(_TRAINED[name], 1024, epochs=3, warmup=20)
    return _TRAINED[name]


def _source(seed=1):
    src = np.random.default_rng(seed).integers(4, VOCAB, size=(3, 7)).astype("int32")
    src[1, 4:] = 0
    src[2, 6:] = 0
    return src


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def full_logits(model, src, prefix):
    return np.asarray(
        model({"source_ids": src, "target_ids": np.asarray(prefix, "int32")}), "float64"
    )


def reference_greedy(model, src, length):
    """Re-runs the whole model on the growing prefix at every step."""
    batch = len(src)
    prefix = np.full((batch, 1), BOS_ID, "int32")
    out = np.zeros((batch, length), "int32")
    done = np.zeros(batch, bool)
    for i in range(length):
        nxt = full_logits(model, src, prefix)[:, -1].argmax(-1).astype("int32")
        nxt[done] = 0
        out[:, i] = nxt
        done |= nxt == EOS_ID
        prefix = np.concatenate([prefix, nxt[:, None]], 1)
        if done.all():
            break
    return out


def reference_beam(model, src_row, width, alpha, length, n_best=False):
    """Plain-Python beam search with the documented rules, full recompute. With
    `n_best`: every (ids, normalised score) it ends with, finished ones first."""

    def penalty(n):
        return ((5.0 + n) / 6.0) ** alpha

    alive, finished = [([], 0.0)], []
    for i in range(length):
        candidates = []
        for seq, logp in alive:
            scores = _log_softmax(full_logits(model, src_row[None], [[BOS_ID] + seq])[0, -1])
            candidates += [(logp + scores[v], seq + [v]) for v in range(VOCAB)]
        top = sorted(candidates, key=lambda c: -c[0])[: 2 * width]
        finished += [
            (seq, s / penalty(i + 1))
            for r, (s, seq) in enumerate(top)
            if seq[-1] == EOS_ID and r < width
        ]
        finished = sorted(finished, key=lambda f: -f[1])[:width]
        alive = [(seq, s) for s, seq in top if seq[-1] != EOS_ID][:width]
        if len(finished) == width and finished[-1][1] >= alive[0][1] / penalty(i + 1):
            break
    if n_best:
        return finished + [(seq, s / penalty(length)) for seq, s in alive]
    return finished[0][0] if finished else alive[0][0]


def _cut(row):
    row = list(row)
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_step_logits_match_full_decoder(name):
    model = _model(name)
    src = _source()
    prefix = np.concatenate(
        [np.full((3, 1), BOS_ID), np.random.default_rng(2).integers(4, VOCAB, (3, LENGTH - 1))], 1
    )
    want = full_logits(model, src, prefix)
    encoder_output, mask = model.encode(src)
    cross = model.cross_caches(encoder_output)
    caches = model.empty_caches(3, LENGTH)
    for i in range(LENGTH):
        logits, caches = model.decode_step(prefix[:, i], i, caches, cross, mask)
        np.testing.assert_allclose(np.asarray(logits), want[:, i], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_mixed_precision_model_computes_in_its_policy_and_keeps_it_when_loaded(name, tmp_path):
    """`dtype="mixed_bfloat16"` reaches every layer (the global policy stays float32),
    survives a save and load, and gives the float32 model's logits to bfloat16's
    precision."""
    model = _model(name, dtype="mixed_bfloat16")
    reference = _model(name)
    reference.set_weights(model.get_weights())
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    src = _source()
    prefix = np.concatenate([np.full((3, 1), BOS_ID), src[:, :4]], 1)
    want = full_logits(reference, src, prefix)
    for m in (model, loaded):
        policies = {layer.dtype_policy.name for layer in [m, *m._flatten_layers()]}
        assert policies == {"mixed_bfloat16"}, policies
        got = full_logits(m, src, prefix)
        np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max())
        assert np.abs(got - want).max() > 0, "computed in float32, not bfloat16"


@pytest.mark.parametrize("name", ["preln-sinusoidal-shared", "universal-act"])
def test_cached_greedy_gives_reference_tokens(name):
    model = _trained(name)
    src = _source()
    want = reference_greedy(model, src, LENGTH)
    assert len({int(t) for t in want.ravel()}) > 3, "degenerate model: tokens would match trivially"
    np.testing.assert_array_equal(np.asarray(decoding.greedy(model, src, LENGTH)), want)
    rows = [[int(t) for t in r if t] for r in src]
    beam = decoding.generate_ids(model, rows, samplers.Beam(width=1), max_length=LENGTH)
    assert [c[0][0] for c in beam] == [[int(t) for t in _cut(r) if t != EOS_ID] for r in want]


def test_xla_compiled_decoders_match_eager():
    model = _trained("universal-act")
    src = _source()
    np.testing.assert_array_equal(
        np.asarray(decoding.compiled(model, "greedy")(src)), reference_greedy(model, src, LENGTH)
    )
    eager = decoding.beam_candidates(model, src, width=3, alpha=0.6)
    xla = decoding.compiled(model, "beam_candidates", width=3)(src)
    for a, b in zip(eager, xla):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5)


@pytest.mark.parametrize("name,alpha", [("preln-sinusoidal-shared", 0.6)])
def test_beam_matches_reference_search(name, alpha):
    model = _trained(name)
    src = _source(4)
    rows = [[int(t) for t in r if t] for r in src]
    ids = decoding.decode_ids(model, rows, beam_width=3, alpha=alpha, max_length=LENGTH)
    for row, got in zip(src, ids):
        want = reference_beam(model, row, 3, alpha, LENGTH)
        assert got == [t for t in want if t != EOS_ID]


def test_beam_one_equals_greedy_for_any_length_penalty():
    model = _trained("preln-sinusoidal-shared")
    src = _source(6)
    rows = [[int(t) for t in r if t] for r in src]
    greedy = decoding.decode_ids(model, rows)
    for alpha in (0.0, 2.0):
        beam = decoding.generate_ids(model, rows, samplers.Beam(1, alpha))
        assert [c[0][0] for c in beam] == greedy


def test_decode_ids_batches_and_cuts_at_eos():
    model = _trained("preln-sinusoidal-shared")
    src = _source()
    rows = [[int(t) for t in r if t] for r in src]
    want = reference_greedy(model, src, LENGTH)
    got = decoding.decode_ids(model, rows, batch_size=2)
    assert got == [[int(t) for t in _cut(r) if t != EOS_ID] for r in want]


def test_decode_ids_caps_output_length_by_source_length():
    model = _model("preln-sinusoidal-shared", seed=3, num_layers=3, max_target_length=64)
    rows = [[int(t) for t in r if t] for r in _source()]
    # Sources pad to 8 positions: at most 2 * 8 + 10 -> 32 tokens (EOS included).
    capped = decoding.decode_ids(model, rows)
    full = decoding.decode_ids(model, rows, max_length=64)
    assert all(len(c) <= 32 for c in capped)
    for c, f in zip(capped, full):
        assert f[: len(c)] == c  # greedy tokens do not depend on the cap, only stop earlier
    assert any(len(f) > 32 for f in full)  # the untrained model rambles: the cap bites


def test_bad_arguments():
    model = _model("preln-sinusoidal-shared")
    src = _source()
    with pytest.raises(ValueError, match="width"):
        decoding.beam_candidates(model, src, width=0)
    with pytest.raises(ValueError, match="width"):
        decoding.beam_candidates(model, src, width=VOCAB)
    with pytest.raises(ValueError, match="alpha"):
        decoding.beam_candidates(model, src, alpha=-1.0)
    with pytest.raises(ValueError, match="`alpha`"):
        decoding.decode_ids(model, [[5, 6]], beam_width=2, alpha=-1.0)
    with pytest.raises(ValueError, match="max_length"):
        decoding.greedy(model, src, max_length=0)
    learned = _model("postln-learned-separate-window")
    with pytest.raises(ValueError, match="max_length"):
        decoding.greedy(learned, src, max_length=LENGTH + 1)


def test_beam_n_best_are_the_reference_hypotheses_with_their_scores():
    model = _trained("preln-sinusoidal-shared")
    src = _source(4)
    rows = [[int(t) for t in r if t] for r in src]
    got = decoding.generate_ids(
        model,
        rows,
        samplers.Beam(width=3, length_penalty=0.6),
        num_return_sequences=3,
        max_length=LENGTH,
    )
    best = decoding.decode_ids(model, rows, beam_width=3, alpha=0.6, max_length=LENGTH)
    for row, candidates, first in zip(src, got, best):
        want = reference_beam(model, row, 3, 0.6, LENGTH, n_best=True)[:3]
        assert [ids for ids, _ in candidates] == [
            [t for t in seq if t != EOS_ID] for seq, _ in want
        ]
        np.testing.assert_allclose([s for _, s in candidates], [s for _, s in want], atol=2e-4)
        assert candidates[0][0] == first


def test_greedy_scores_are_the_reference_log_probabilities():
    model = _trained("universal-act")
    src = _source()
    rows = [[int(t) for t in r if t] for r in src]
    got = decoding.generate_ids(model, rows, samplers.Greedy(), max_length=LENGTH)
    want = reference_greedy(model, src, LENGTH)
    for b, ((ids, score),) in enumerate(got):
        seq = _cut(want[b])
        logp = _log_softmax(full_logits(model, src[b : b + 1], [[BOS_ID] + seq[:-1]])[0])
        assert ids == [t for t in seq if t != EOS_ID]
        np.testing.assert_allclose(score, sum(logp[i, t] for i, t in enumerate(seq)), atol=2e-4)


def _reference_filter(logits, temperature, top_k, top_p):
    x = np.asarray(logits, "float64") / temperature
    keep = np.ones_like(x, bool)
    for r, row in enumerate(x):
        order = np.argsort(-row)
        if top_k is not None:
            keep[r, order[top_k:]] = False
        if top_p is not None:  # on the top-k survivors, renormalised (as Hugging Face's warpers)
            p = np.where(keep[r], np.exp(row - row.max()), 0.0)
            p = p[order] / p.sum()
            n = (
                int(np.searchsorted(np.cumsum(p), top_p - 1e-9)) + 1
            )  # smallest prefix reaching top_p
            keep[r, order[n:]] = False
    return x, keep


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 3, None), (0.5, None, 0.8), (2.0, 5, 0.6), (1.0, None, None)]
)
def test_filter_logits_keeps_the_reference_tokens(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(4, VOCAB)).astype("float32") * 3
    got = np.asarray(decoding.filter_logits(logits, temperature, top_k, top_p))
    scaled, keep = _reference_filter(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(got > -1e8, keep)
    np.testing.assert_allclose(got[keep], scaled[keep], rtol=1e-6)


def test_sampled_first_tokens_follow_the_filtered_softmax():
    """4000 draws of the first token: frequencies within 4 standard errors of the
    temperature-scaled, top-k-filtered softmax of the full decoder; filtered
    tokens (and PAD, BOS) never drawn."""
    model = _trained("preln-sinusoidal-shared")
    n = 4000
    src = np.repeat(_source()[:1], n, axis=0)
    logits = np.array(full_logits(model, src[:1], [[BOS_ID]])[0, -1], "float64")
    logits[[PAD_ID, BOS_ID]] = -np.inf  # never outputs
    scaled, keep = _reference_filter(logits[None], 3.0, 6, None)
    p = np.where(keep[0], np.exp(scaled[0] - scaled[0].max()), 0.0)
    p /= p.sum()
    assert p.max() < 0.6, "too peaked to test the distribution"
    first = np.asarray(decoding.sample(model, src, 7, temperature=3.0, top_k=6, max_length=1))[:, 0]
    freq = np.bincount(first, minlength=VOCAB) / n
    assert np.all(freq[p == 0] == 0) and freq[PAD_ID] == 0 and freq[BOS_ID] == 0
    np.testing.assert_array_less(np.abs(freq - p), 4 * np.sqrt(p * (1 - p) / n) + 1e-3)


def test_sampling_is_repeatable_with_a_seed_and_top_k_1_is_greedy():
    model = _trained("preln-sinusoidal-shared")
    rows = [[int(t) for t in r if t] for r in _source()]
    draw = lambda seed: decoding.generate_ids(  # noqa: E731
        model, rows, samplers.Sampling(temperature=5.0), num_return_sequences=4, seed=seed
    )
    first = draw(1)
    assert draw(1) == first and draw(2) != first
    assert all(len(c) == 4 for c in first)
    assert len({tuple(ids) for c in first for ids, _ in c}) > 4
    greedy = decoding.decode_ids(model, rows)
    top1 = decoding.generate_ids(model, rows, samplers.TopK(1), num_return_sequences=2, seed=0)
    assert [[ids for ids, _ in c] for c in top1] == [[g, g] for g in greedy]


def test_generation_arguments_are_checked():
    model = _model("preln-sinusoidal-shared")
    rows = [[5, 6, 7]]
    with pytest.raises(ValueError, match="num_return_sequences"):
        decoding.generate_ids(model, rows, samplers.Greedy(), num_return_sequences=2)
    with pytest.raises(ValueError, match="num_return_sequences"):
        decoding.generate_ids(model, rows, samplers.Beam(width=2), num_return_sequences=3)
    with pytest.raises(ValueError, match="top_p"):
        samplers.Sampling(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        samplers.Sampling(temperature=0)
    with pytest.raises(ValueError, match="sampler"):
        samplers.get("nucleus")
    with pytest.raises(ValueError, match="top_k"):
        decoding.filter_logits(np.zeros((1, VOCAB), "float32"), top_k=0)


def test_translate_gives_empty_text_for_a_text_without_ids():
    """`Seq2SeqTransformer.translate` and `generate` are `zoo.lite.Translator`'s: a text
    that tokenizes to no ids gives "" without running the model, as `zoo.load` and
    `zoo.lite` give it; the other texts translate as they do alone."""
    from zoo.seq2seq.tokenization import encode_proto, train_sentencepiece

    texts = ["abc def", "cab fed", "bad face", "dead beef", "ace bed"] * 4
    proto = train_sentencepiece(texts, vocab_size=24, normalization="identity")
    keras.utils.set_random_seed(0)
    model = zoo.build(
        "seq2seq",
        tokenizer=encode_proto(proto),
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        intermediate_dim=32,
        max_source_length=16,
        max_target_length=LENGTH,
    )
    assert model.tokenizer.encode_within(["", "   "], 16) == [[], []]
    alone = model.translate("abc def")
    for beam_width in (1, 3):
        assert model.translate("", beam_width=beam_width) == ""
        assert model.translate(["", "abc def", "   "], beam_width=beam_width)[::2] == ["", ""]
    assert model.translate(["", "abc def", "   "])[1] == alone
    assert model.generate(["", "abc def"], return_scores=True)[0] == [("", 0.0)]
