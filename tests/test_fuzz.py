"""Fuzzing (hypothesis): the data readers, the attention layers and the served models.

Readers: random bytes and mutated valid files either parse or raise the project's own
`DataError` (which the CLIs turn into one line and exit 2), never anything else.
Layers: random shapes, masks, options and dtypes give finite outputs of the promised
shapes, attention weights that respect the masks, and outputs that do not depend on
masked-out keys.
Served models: the tagger and seq2seq SavedModels on any batch of Unicode strings
answer what the Keras model answers on the same input, or refuse in our own words.

`make test` runs a few hundred examples of each reader fuzzer and the default profile's
count for the (costlier) layer fuzzers; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs many more.
"""

import gzip
import io
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.paths import ROOT
from zoo.cli import DataError

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

SMALL_CONLLU = open(os.path.join(ROOT, "tests", "fixtures", "tagger", "small.conllu"), "rb").read()
PARALLEL = "ein kleiner Test\tsmall test\nzwei Wörter\ttwo words\n".encode()

PROFILE_EXAMPLES = settings.default.max_examples
READER_SETTINGS = settings(
    max_examples=max(300, PROFILE_EXAMPLES),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LAYER_SETTINGS = settings(
    max_examples=max(25, PROFILE_EXAMPLES // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# ---------------------------------------------------------------------------
# Mutations of valid files.


@st.composite
def mutated(draw, valid):
    """`valid` with a few random edits: flip, insert, delete, truncate, duplicate lines."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "swap_lines", "tab"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[pos:]
        elif op == "tab":
            data[pos:pos] = draw(
                st.sampled_from([b"\t", b"\n", b"\r\n", b"\n\n", b"#", b"-", b"."])
            )
        elif op == "swap_lines":
            lines = bytes(data).split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def _tmpfile(data, suffix):
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _parses_or_data_error(read, *datas, suffix=".txt"):
    paths = [_tmpfile(d, suffix) for d in datas]
    try:
        return read(*paths)
    except DataError as e:
        message = str(e)
        assert message and "\n" not in message, message
        assert any(p in message for p in paths), message  # names the file
        return None
    finally:
        for p in paths:
            os.unlink(p)


# ---------------------------------------------------------------------------
# CoNLL-U.


@READER_SETTINGS
@given(data=st.one_of(st.binary(max_size=400), mutated(SMALL_CONLLU)))
def test_fuzz_conllu_reader(data):
    from train.tagger.conllu import read_conllu
    from train.tagger.types import TaggedSentence

    sentences = _parses_or_data_error(read_conllu, data, suffix=".conllu")
    if sentences is not None:
        assert sentences and all(isinstance(s, TaggedSentence) for s in sentences)
        assert all(s.tokens and len(s.tokens) == len(s.tags) for s in sentences)
        assert all(t and t != "_" for s in sentences for t in s.tags)


# ---------------------------------------------------------------------------
# Parallel text and TSV (plain and gzip).


def _maybe_gzip(data, compress):
    return gzip.compress(data) if compress else data


@READER_SETTINGS
@given(
    source=st.one_of(st.binary(max_size=200), mutated(PARALLEL)),
    target=st.one_of(st.binary(max_size=200), mutated(PARALLEL)),
    compress=st.booleans(),
)
def test_fuzz_parallel_reader(source, target, compress):
    from train.seq2seq.parallel import read_parallel

    pairs = _parses_or_data_error(read_parallel, _maybe_gzip(source, compress), target)
    if pairs is not None:
        assert all(s.strip() and t.strip() for s, t in pairs)


@READER_SETTINGS
@given(
    data=st.one_of(st.binary(max_size=300), mutated(PARALLEL), mutated(gzip.compress(PARALLEL))),
    compress=st.booleans(),
)
def test_fuzz_tsv_reader(data, compress):
    from train.seq2seq.parallel import read_tsv

    pairs = _parses_or_data_error(read_tsv, _maybe_gzip(data, compress))
    if pairs is not None:
        assert pairs and all(len(p) == 2 and p[0].strip() and p[1].strip() for p in pairs)


# ---------------------------------------------------------------------------
# Image directories.


def _png(size=32, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


VALID_PNG = _png()


def _image_dir(root, blobs):
    for i, blob in enumerate(blobs):
        folder = os.path.join(root, f"class{i % 2}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"img{i}.png"), "wb") as f:
            f.write(blob)


@READER_SETTINGS
@given(blob=st.one_of(st.binary(max_size=200), mutated(VALID_PNG)))
def test_fuzz_image_dir_headers(blob):
    """The size scan over the directory: every file is an image or a DataError."""
    from train.sagan import images
    from zoo.cli import UsageError

    with tempfile.TemporaryDirectory() as root:
        _image_dir(root, [VALID_PNG, blob])
        try:
            files = images._list_image_dir(root)
            size = images._common_size(files, None)
        except (DataError, UsageError) as e:
            assert root in str(e) or "image size" in str(e), str(e)
            return
        assert size == 32


@settings(
    max_examples=max(12, PROFILE_EXAMPLES // 5),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(blob=mutated(VALID_PNG))
def test_fuzz_image_dir_full_load(blob):
    """Decoding too: a file whose header reads but whose pixels do not is a DataError."""
    from train.sagan import images

    with tempfile.TemporaryDirectory() as root:
        _image_dir(root, [VALID_PNG, _png(seed=1), _png(seed=2), _png(seed=3), blob])
        try:
            data = images.load_image_dir(root)
        except DataError as e:
            assert root in str(e), str(e)
            return
        assert data.train.dtype == np.uint8 and data.image_size == 32
        assert len(data.train) + len(data.test) == 5


# ---------------------------------------------------------------------------
# Layers.


@st.composite
def attention_case(draw):
    batch = draw(st.integers(1, 3))
    q_len = draw(st.integers(1, 6))
    self_attention = draw(st.booleans())
    k_len = q_len if self_attention else draw(st.integers(1, 6))
    heads = draw(st.integers(1, 3))
    rotary = draw(st.booleans())
    key_dim = draw(st.integers(1, 3)) * (2 if rotary else 1)
    options = dict(
        score=draw(st.sampled_from(["scaled_dot", "dot", "additive"])),
        normalize=draw(st.sampled_from(["softmax", "relu"])),
        causal=self_attention and draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.integers(0, 3))) if self_attention else None,
        include_self=draw(st.booleans()) if self_attention else True,
        rotary=rotary,
    )
    features = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    key_valid = draw(st.lists(st.booleans(), min_size=batch * k_len, max_size=batch * k_len))
    dtype = draw(st.sampled_from(["float32", "float16", "float64"]))
    return (
        batch,
        q_len,
        k_len,
        self_attention,
        heads,
        key_dim,
        features,
        options,
        seed,
        key_valid,
        dtype,
    )


@LAYER_SETTINGS
@given(case=attention_case())
def test_fuzz_multi_head_attention(case):
    from layers import MultiHeadAttention

    (
        batch,
        q_len,
        k_len,
        self_attention,
        heads,
        key_dim,
        features,
        options,
        seed,
        key_valid,
        dtype,
    ) = case
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(batch, q_len, features)).astype(dtype)
    value = None if self_attention else rng.normal(size=(batch, k_len, features)).astype(dtype)
    key_mask = np.array(key_valid, bool).reshape(batch, k_len)
    layer = MultiHeadAttention(heads, key_dim, **options)
    kwargs = {"query_mask" if self_attention else "value_mask": key_mask}
    out, scores = layer(query, value, return_attention_scores=True, **kwargs)
    out, scores = np.asarray(out, "float64"), np.asarray(scores, "float64")

    assert out.shape == (batch, q_len, features)
    assert scores.shape == (batch, heads, q_len, k_len)
    assert np.isfinite(out).all() and np.isfinite(scores).all()
    # Masked keys get exactly zero weight; weights are non-negative; softmax rows sum to 1
    # (or 0 for a query that may see no key at all).
    assert (scores[np.broadcast_to(~key_mask[:, None, None, :], scores.shape)] == 0).all()
    assert (scores >= 0).all()
    if options["normalize"] == "softmax":
        sums = scores.sum(-1)
        assert np.all(np.isclose(sums, 1, atol=1e-2) | (sums == 0)), sums

    # Changing what sits at masked key positions changes nothing visible.
    source = query if self_attention else value
    noisy = source.copy()
    noisy[~key_mask] = rng.normal(size=noisy[~key_mask].shape).astype(dtype) * 10
    if self_attention:
        again = np.asarray(layer(noisy, **kwargs), "float64")
        visible = key_mask  # a padded query's own output may change with its input
    else:
        again = np.asarray(layer(query, noisy, **kwargs), "float64")
        visible = np.ones((batch, q_len), bool)
    tolerance = 5e-2 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(again[visible], out[visible], atol=tolerance, rtol=tolerance)


@LAYER_SETTINGS
@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 7),
    units=st.integers(1, 5),
    features=st.integers(1, 5),
    valid_seed=st.integers(0, 2**31 - 1),
    options=st.fixed_dictionaries(
        {
            "score": st.sampled_from(["scaled_dot", "dot", "additive"]),
            "normalize": st.sampled_from(["softmax", "relu"]),
            "causal": st.booleans(),
            "window": st.one_of(st.none(), st.integers(0, 3)),
            "include_self": st.booleans(),
        }
    ),
    mixed=st.booleans(),
)
def test_fuzz_self_attention_and_encoder_block(
    batch, length, units, features, valid_seed, options, mixed
):
    import keras

    from layers import SelfAttention, TransformerEncoderBlock

    rng = np.random.default_rng(valid_seed)
    lengths = rng.integers(1, length + 1, size=batch)
    mask = np.arange(length)[None, :] < lengths[:, None]
    x = rng.normal(size=(batch, length, features)).astype("float32")
    noisy = np.where(mask[..., None], x, rng.normal(size=x.shape).astype("float32") * 10)
    if mixed:
        keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = SelfAttention(units, **options)
        heads = 1 + int(features % 2 == 0)
        block = TransformerEncoderBlock(
            heads,
            4,
            dropout=0.0,
            score=options["score"],
            normalize=options["normalize"],
            causal=options["causal"],
            window=options["window"],
        )
        for layer, kwargs in ((attention, {"return_attention_scores": True}), (block, {})):
            result = layer(x, mask=mask, **kwargs)
            out = np.asarray(result[0] if isinstance(result, tuple) else result, "float32")
            assert np.isfinite(out).all()
            assert out.shape[:2] == (batch, length)
            if isinstance(result, tuple):
                scores = np.asarray(result[1], "float32")
                assert scores.shape == (batch, length, length)
                assert (scores[np.broadcast_to(~mask[:, None, :], scores.shape)] == 0).all()
            again = np.asarray(
                layer(noisy, mask=mask) if not kwargs else layer(noisy, mask=mask, **kwargs)[0],
                "float32",
            )
            tolerance = 5e-2 if mixed else 1e-4
            np.testing.assert_allclose(again[mask], out[mask], atol=tolerance, rtol=tolerance)
    finally:
        keras.config.set_dtype_policy("float32")


@LAYER_SETTINGS
@given(
    batch=st.integers(1, 2),
    length=st.integers(1, 5),
    heads=st.integers(1, 2),
    key_dim=st.integers(1, 3),
    extra=st.integers(0, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_cached_decoding_matches_full_causal_attention(
    batch, length, heads, key_dim, extra, seed
):
    """Any cache length >= the sequence: step-by-step decoding equals causal attention."""
    from layers import MultiHeadAttention

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, length, 4)).astype("float32")
    layer = MultiHeadAttention(heads, key_dim, causal=True)
    full = np.asarray(layer(x))
    cache = np.zeros((batch, 2, length + extra, heads, key_dim), "float32")
    steps = []
    for t in range(length):
        y, cache = layer(x[:, t : t + 1], cache=cache, cache_index=t)
        steps.append(np.asarray(y))
    assume(len(steps) == length)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------
# Served models (#48): the tagger and seq2seq SavedModels on any Unicode text.

SERVING_SETTINGS = settings(
    max_examples=max(15, PROFILE_EXAMPLES // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Any text (every code point but surrogates), and text of the embedded tasks' own
# characters (the seq2seq run's vocabulary) with spaces, so tokens are also known ones.
ANY_TEXT = st.one_of(
    st.text(max_size=24), st.text(st.sampled_from(list("abcdefghij I saw the dog")), max_size=16)
)


@pytest.fixture(scope="module")
def served(shared_runs):
    """{kind: (Keras model, loaded SavedModel)}: the pages' tiny tagger and seq2seq runs
    and their SavedModels (shared with the other tests)."""
    import tensorflow as tf

    import zoo
    import zoo.models  # noqa: F401  (registers every class zoo model files name)
    from tests.support import tiny

    found = {}
    for kind, out in (("tagger", "serving/tagger"), ("seq2seq", "serving/mt")):
        run = shared_runs.command("train", tiny.PAGE_RUNS[kind])
        base = shared_runs.command("export", ["savedmodel", run, "--out", out])
        found[kind] = (zoo.load(run).model, tf.saved_model.load(f"{base}/1"))
    return found


def _ours(error, phrase):
    """An InvalidArgumentError raised by one of our assertions, saying `phrase`."""
    import tensorflow as tf

    return isinstance(error, tf.errors.InvalidArgumentError) and phrase in str(error)


@SERVING_SETTINGS
@given(sentences=st.lists(ANY_TEXT, max_size=4))
def test_fuzz_tagger_savedmodel_tags_any_text_as_keras(served, sentences):
    """serving_default on any batch of strings: Tagger.tag's tokens and tags."""
    import tensorflow as tf

    model, loaded = served["tagger"]
    try:
        out = loaded.signatures["serving_default"](sentences=tf.constant(sentences, tf.string))
    except Exception as e:
        assert _ours(e, "more tokens than max_len"), repr(e)[:1000]
        assert any(len(s.split()) > model.max_len for s in sentences)
        return
    want = model.tag(sentences)
    lengths = out["lengths"].numpy().tolist()
    assert lengths == [len(row) for row in want]
    for r, row in enumerate(want):
        tokens = [t.decode() for t in out["tokens"].numpy()[r][: lengths[r]]]
        tags = [t.decode() for t in out["tags"].numpy()[r][: lengths[r]]]
        assert list(zip(tokens, tags)) == row


@SERVING_SETTINGS
@given(rows=st.lists(st.lists(ANY_TEXT, max_size=5), max_size=4))
def test_fuzz_tagger_savedmodel_tag_tokens_any_shape_as_keras(served, rows):
    """tag_tokens on any [batch, time] of strings ("" is padding, anywhere): the Keras
    model's tag ids on the same tokens, -1 at the padding."""
    import tensorflow as tf

    model, loaded = served["tagger"]
    width = max([len(r) for r in rows], default=0)
    tokens = np.array([r + [""] * (width - len(r)) for r in rows], dtype=object).reshape(
        len(rows), width
    )
    out = loaded.signatures["tag_tokens"](tokens=tf.constant(tokens, tf.string))
    got = out["tag_ids"].numpy()
    present = tokens != ""
    assert got.shape == tokens.shape
    assert out["lengths"].numpy().tolist() == present.sum(axis=1).tolist()
    assert (got[~present] == -1).all()
    if tokens.size:
        want = np.asarray(model.predict_ids(tf.constant(tokens, tf.string)))
        np.testing.assert_array_equal(got[present], want[present])


@SERVING_SETTINGS
@given(texts=st.lists(ANY_TEXT, max_size=4))
def test_fuzz_seq2seq_savedmodel_translates_any_text_as_keras(served, texts):
    """translate on any batch of strings: the Keras model's greedy tokens on the
    `sentencepiece` package's ids, and the package's decoded text."""
    import sentencepiece as spm
    import tensorflow as tf

    from tests.export.test_serving_totality import keras_translate

    model, loaded = served["seq2seq"]
    try:
        out = loaded.signatures["translate"](text=tf.constant(texts, tf.string))
    except Exception as e:
        assert _ours(e, "more tokens than max_source_length"), repr(e)[:1000]
        sp = spm.SentencePieceProcessor(model_proto=bytes(model.tokenizer.proto))
        assert any(len(sp.encode(t)) > model.max_source_length for t in texts)
        return
    want_text, want_ids = keras_translate(model, texts)
    np.testing.assert_array_equal(out["token_ids"].numpy(), want_ids)
    assert [t.decode() for t in out["translation"].numpy()] == want_text


def test_fuzz_profiles_are_wired():
    """`make fuzz` must actually run more examples than `make test`."""
    from hypothesis import settings as current

    assert current.get_profile("fuzz").max_examples > current.get_profile("default").max_examples
    assert READER_SETTINGS.max_examples >= 300
