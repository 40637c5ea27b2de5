"""Served models never fail on what a client can send (#48).

Every signature of the tagger, seq2seq (transformer and universal transformer) and
SAGAN SavedModels, run in a fresh process in which `tensorflow_text` cannot be imported
(as the stock model server runs them), on what a client can send: empty strings,
whitespace, unseen characters, other scripts, control characters, emoji, malformed
UTF-8, mixed batches, empty batches, empty rows, out-of-range ids and positions, too
long inputs, mismatched or non-finite tensors. Each case either answers what the Keras
model answers on the same input, or is refused with an InvalidArgumentError in our
words that names the problem and the limit. And a SavedModel called from 8 threads at
once answers as it does serially.
"""

import base64
import functools
import json
import threading

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import zoo
import zoo.models  # noqa: F401  (registers every class zoo model files name)
from export.savedmodel import export_savedmodel
from tests.support import tiny
from tests.support.runs import run_clean
from zoo.seq2seq import decoding, sentencepiece_graph

pytestmark = pytest.mark.slow  # exports and a child process: make test-fast leaves it out

# Texts a client can send; the last one is a single 200-character token.
TEXTS = [
    "",
    "   ",
    "\t\n\u3000\u00a0",
    "zzz",
    "1 2 3",
    "你好世界",
    "a\x00b \x1b[0m\x7f \x01",
    "😀 👍🏽 🇫🇷 👨‍👩‍👧",
    "e\u0301te\u0301 ǅ İstanbul ß",
    "\u200b\ufeff\u202e",
    "ｆｕｌｌｗｉｄｔｈ ½ ﬁ",
    "עברית العربية",
    "x" * 200,
]
MALFORMED = [b"\xff\xfeabc", b"caf\xc3 x", b"\xed\xa0\x80z", b"\xf0\x9f\x98 x"]

_CHILD = r"""
import base64, importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow_text":
            raise ImportError("tensorflow_text is blocked: the stock model server lacks its kernels")

sys.meta_path.insert(0, Block())
import numpy as np
import tensorflow as tf

def array(dtype, shape, values):
    if dtype == "string":
        out = np.empty(len(values), object)
        out[:] = [base64.b64decode(v) for v in values]
        return out.reshape(shape)
    return np.asarray(values, dtype).reshape(shape)

def plain(value):
    value = np.asarray(value)
    flat = value.reshape(-1).tolist()
    if value.dtype == object:
        flat = [base64.b64encode(v).decode() for v in flat]
    return ["string" if value.dtype == object else value.dtype.name, list(value.shape), flat]

sessions = {}

# As the model server runs a request: the C++ Session::Run of the signature's graph,
# with no shape check between the client and the graph (Python's signature call and
# Session.run check shapes first).
def served(model, signature, feed):
    if model not in sessions:
        graph = tf.Graph()
        with graph.as_default():
            session = tf.compat.v1.Session(graph=graph)
            meta = tf.compat.v1.saved_model.load(session, ["serve"], dirs[model])
        sessions[model] = graph, session, meta
    graph, session, meta = sessions[model]
    signature = meta.signature_def[signature]
    tensor = lambda info: graph.get_tensor_by_name(info.name)._as_tf_output()
    feeds = {tensor(signature.inputs[k]): v for k, v in feed.items()}
    names = sorted(signature.outputs)
    fetches = [tensor(signature.outputs[k]) for k in names]
    return dict(zip(names, session._call_tf_sessionrun(None, feeds, fetches, [], None)))

with open(sys.argv[1]) as f:
    dirs, cases = json.load(f)
loaded = {name: tf.saved_model.load(path) for name, path in dirs.items()}
results = []
for model, signature, feed, raw in cases:
    feed = {k: array(*v) for k, v in feed.items()}
    try:
        if raw:
            out = served(model, signature, feed)
        else:
            fn = loaded[model].signatures[signature]
            out = {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in feed.items()}).items()}
        results.append({"ok": {k: plain(v) for k, v in out.items()}})
    except Exception as e:  # the test tells ours from others by type and message
        results.append({"error": [type(e).__name__, str(e)[:3000]]})
bad = [m for m in sys.modules if m.split(".")[0] in ("layers", "zoo", "train", "export",
                                                          "tensorflow_text")]
assert not bad, bad
print(json.dumps(results))
"""


def _wire(value, dtype):
    """A feed value as the child reads it: [dtype, shape, flat values]."""
    if dtype == "string":
        array = np.asarray(value, object)
        flat = [v.encode() if isinstance(v, str) else v for v in array.reshape(-1)]
        return ["string", list(array.shape), [base64.b64encode(v).decode() for v in flat]]
    array = np.asarray(value, dtype)
    return [dtype, list(array.shape), array.reshape(-1).tolist()]


def _read(wire):
    dtype, shape, flat = wire
    if dtype == "string":
        array = np.empty(len(flat), object)
        array[:] = [base64.b64decode(v) for v in flat]
        return array.reshape(shape)
    return np.asarray(flat, dtype).reshape(shape)


def _strings(rows):
    """A (ragged) list of str rows padded with "" into a [B, T] object array."""
    width = max([len(r) for r in rows], default=0)
    array = np.empty((len(rows), width), object)
    array[:] = ""
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


class Case:
    """One request: `model` (a key of the exports), `signature`, `feed` {name: (value,
    dtype)}, and either `refusal` (a phrase of our message) or `check(outputs)`, which
    compares the answer with the Keras model's on the same input. `raw`: sent as the
    model server sends it, unchecked by Python's signature call (another shape)."""

    def __init__(self, model, signature, feed, refusal=None, check=None, raw=False):
        self.model, self.signature, self.feed = model, signature, feed
        self.refusal, self.check, self.raw = refusal, check, raw

    def wire(self):
        feed = {k: _wire(v, d) for k, (v, d) in self.feed.items()}
        return [self.model, self.signature, feed, self.raw]

    def __repr__(self):
        shapes = {k: np.shape(np.asarray(v, object)) for k, (v, _) in self.feed.items()}
        return f"{self.model}/{self.signature} {shapes} refusal={self.refusal!r}"


# ---------------------------------------------------------------- exports and references
@pytest.fixture(scope="module")
def exports(shared_runs, tmp_path_factory):
    """{name: (Keras model, SavedModel version directory)}: the pages' tiny tagger,
    seq2seq and SAGAN runs (shared with the other tests) and a universal transformer
    whose every answer is EOS at once (an empty translation: the case that failed)."""
    import keras

    found = {}
    for kind, out in (
        ("tagger", "serving/tagger"),
        ("seq2seq", "serving/mt"),
        ("sagan", "serving/sagan"),
    ):
        run = shared_runs.command("train", tiny.PAGE_RUNS[kind])
        base = shared_runs.command("export", ["savedmodel", run, "--out", out])
        found[kind] = (zoo.load(run).model, f"{base}/1")
    keras.utils.set_random_seed(5)
    eos = zoo.build(
        "universal_transformer",
        tokenizer=found["seq2seq"][0].tokenizer_proto,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        num_steps=2,
        max_source_length=24,
        max_target_length=8,
        share_embeddings=False,
    )
    bias = np.zeros(eos.vocabulary_size, "float32")
    bias[3] = 1e4  # EOS
    eos.output_projection.bias.assign(bias)
    found["eos"] = (eos, export_savedmodel(eos, str(tmp_path_factory.mktemp("eos") / "eos")))
    return found


def keras_translate(model, texts):
    """The Keras model on what the translate signature computes: the `sentencepiece`
    package's ids, padded to max_source_length, greedy decoding for max_target_length
    tokens, the package's decoding; (texts, ids [B, L])."""
    limit = int(model.max_source_length)
    sp = spm.SentencePieceProcessor(model_proto=bytes(model.tokenizer.proto))
    rows = [sp.encode(t) for t in texts]  # str, or bytes as they are
    assert all(len(r) <= limit for r in rows)
    ids = np.zeros((len(rows), limit), "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    out = np.asarray(keras_greedy(model, ids))
    return model.tokenizer.decode(out.tolist()), out


def keras_greedy(model, ids):
    """The Keras model's greedy decoding of `ids` [B, S] for max_target_length tokens."""
    if not len(ids):
        return np.zeros((0, model.max_target_length), "int32")
    return _greedy_graph(model)(tf.constant(ids, tf.int32))


@functools.lru_cache(maxsize=None)
def _greedy_graph(model):
    # One trace for every batch and width, as the translate_ids signature has.
    return tf.function(
        lambda ids: decoding.greedy(model, ids),
        input_signature=[tf.TensorSpec([None, None], tf.int32)],
    )


def _texts(values):
    return [v.decode("utf-8") for v in np.ravel(values)]


def _tagger_cases(tagger):
    cases = []
    rng = np.random.default_rng(0)
    max_len, max_chars = int(tagger.max_len), int(tagger.max_chars)

    def tag_check(sentences):
        want = tagger.tag(sentences)

        def check(out):
            lengths = out["lengths"].tolist()
            assert lengths == [len(row) for row in want]
            for r, row in enumerate(want):
                assert _texts(out["tags"][r][: lengths[r]]) == [tag for _, tag in row]
                assert (out["tag_ids"][r][lengths[r] :] == -1).all()

        return check

    def tokens_check(rows):
        tokens = _strings(rows)

        def check(out):
            present = tokens != ""
            assert out["lengths"].tolist() == present.sum(axis=1).tolist()
            if tokens.size:
                want = np.asarray(tagger.predict_ids(tf.constant(tokens.tolist(), tf.string)))
                np.testing.assert_array_equal(out["tag_ids"][present], want[present])
            assert (out["tag_ids"][~present] == -1).all()
            assert out["tag_ids"].shape == tokens.shape

        return check

    def ids_check(word_ids, char_ids):
        def check(out):
            assert out["probabilities"].shape == (*np.shape(word_ids), len(tagger.tags))
            if np.size(word_ids):
                want = np.asarray(
                    tagger.core({"word_ids": word_ids, "char_ids": char_ids}, training=False)
                )
                np.testing.assert_allclose(out["probabilities"], want, atol=1e-5)

        return check

    sentence_batches = [[t] for t in TEXTS] + [TEXTS, [], ["I saw a saw", ""] * 3]
    for batch in sentence_batches + [[" ".join(["saw"] * max_len)]]:
        check = tag_check(batch)
        cases.append(
            Case("tagger", "serving_default", {"sentences": (batch, "string")}, None, check)
        )
    # Malformed UTF-8 (no str holds it): the Keras model on the same byte tokens.
    malformed = tokens_check([b.split() for b in MALFORMED])
    cases.append(
        Case(
            "tagger",
            "serving_default",
            {"sentences": (MALFORMED, "string")},
            None,
            lambda out: malformed(out) or _same_tokens(out, MALFORMED),
        )
    )
    cases.append(
        Case(
            "tagger",
            "serving_default",
            {"sentences": (["a", " ".join(["saw"] * (max_len + 1))], "string")},
            f"a sentence has more tokens than max_len ({max_len})",
        )
    )
    token_rows = [
        [t.split() for t in TEXTS],
        [["I", "", "saw"], ["", ""], ["\x00", "😀", "a b"]],
        [[]],
        [[], []],
        [],
        [["x"] * max_len],
    ]
    for rows in token_rows:
        cases.append(
            Case(
                "tagger",
                "tag_tokens",
                {"tokens": (_strings(rows), "string")},
                None,
                tokens_check(rows),
            )
        )
    cases.append(
        Case(
            "tagger",
            "tag_tokens",
            {"tokens": (_strings([["x"] * (max_len + 1)]), "string")},
            f"a sentence has more tokens than max_len ({max_len})",
        )
    )
    words, chars = len(tagger.words), len(tagger.chars)
    for b, t in ((2, 5), (0, 3), (2, 0), (0, 0), (1, max_len)):
        w = rng.integers(0, words, (b, t)).astype("int32")
        c = rng.integers(0, chars, (b, t, max_chars)).astype("int32")
        cases.append(
            Case(
                "tagger",
                "predict_ids",
                {"word_ids": (w, "int32"), "char_ids": (c, "int32")},
                None,
                ids_check(w, c),
            )
        )
    good_w, good_c = np.ones((1, 3), "int32"), np.ones((1, 3, max_chars), "int32")
    for w, c, refusal in (
        ([[1, -1, 2]], good_c, "word_ids must be >= 0"),
        ([[1, words, 2]], good_c, f"word_ids must be < {words}"),
        (good_w, np.full((1, 3, max_chars), -1), "char_ids must be >= 0"),
        (good_w, np.full((1, 3, max_chars), chars), f"char_ids must be < {chars}"),
        (good_w, np.ones((1, 4, max_chars)), "char_ids must be [batch, time, max_chars]"),
        (good_w, np.ones((2, 3, max_chars)), "char_ids must be [batch, time, max_chars]"),
        (
            np.ones((1, max_len + 1)),
            np.ones((1, max_len + 1, max_chars)),
            f"word_ids has more positions than max_len ({max_len})",
        ),
    ):
        feed = {"word_ids": (w, "int32"), "char_ids": (c, "int32")}
        cases.append(Case("tagger", "predict_ids", feed, refusal))
    # As the model server feeds them: other ranks and sizes, refused before the model.
    wide = np.ones((1, 3, max_chars + 4))
    for signature, feed, refusal in (
        (
            "serving_default",
            {"sentences": ([["I saw"]], "string")},
            "sentences must have shape [?]",
        ),
        ("serving_default", {"sentences": ("I saw", "string")}, "sentences must have shape [?]"),
        ("tag_tokens", {"tokens": (["I", "saw"], "string")}, "tokens must have shape [?, ?]"),
        (
            "predict_ids",
            {"word_ids": (good_w, "int32"), "char_ids": (wide, "int32")},
            f"char_ids must have shape [?, ?, {max_chars}]",
        ),
        (
            "predict_ids",
            {"word_ids": ([1, 2, 3], "int32"), "char_ids": (good_c, "int32")},
            "word_ids must have shape [?, ?]",
        ),
    ):
        cases.append(Case("tagger", signature, feed, refusal, raw=True))
    feed = {"sentences": (TEXTS, "string")}
    cases.append(Case("tagger", "serving_default", feed, None, tag_check(TEXTS), raw=True))

    return cases


def _seq2seq_cases(name, model, answers_eos=False):
    """The five signatures of a seq2seq SavedModel; `answers_eos`: every translation
    of this model is empty (its output layer favours EOS)."""
    cases = []
    rng = np.random.default_rng(0)
    limit, length, vocab = (
        int(model.max_source_length),
        int(model.max_target_length),
        int(model.vocabulary_size),
    )
    sp = spm.SentencePieceProcessor(model_proto=bytes(model.tokenizer.proto))
    fits = [t for t in TEXTS if len(sp.encode(t)) <= limit]
    too_long = [t for t in TEXTS if len(sp.encode(t)) > limit]
    # A text of exactly max_source_length ids (the char tokenizer of the embedded
    # tasks: one id per letter) and one of one more.
    assert len(sp.encode("a" * limit)) == limit
    fits.append("a" * limit)
    too_long.append("a" * (limit + 1))

    def translate_check(texts):
        def check(out):
            want_text, want_ids = keras_translate(model, texts)
            np.testing.assert_array_equal(out["token_ids"], want_ids)
            assert _texts(out["translation"]) == want_text
            if answers_eos:
                assert want_text == [""] * len(texts)

        return check

    for signature in ("serving_default", "translate"):
        for batch in [[t] for t in fits] + [fits, [], ["abc", "", "zzz"] * 2]:
            cases.append(
                Case(name, signature, {"text": (batch, "string")}, None, translate_check(batch))
            )
        cases.append(
            Case(
                name,
                signature,
                {"text": (MALFORMED, "string")},
                None,
                translate_check(MALFORMED),
            )
        )
        for text in too_long:
            cases.append(
                Case(
                    name,
                    signature,
                    {"text": (["abc", text], "string")},
                    f"an input has more tokens than max_source_length ({limit})",
                )
            )

    def ids_translate_check(ids):
        def check(out):
            # Zero positions run as one padding position (pad_empty).
            source = ids if ids.shape[1] else np.zeros((len(ids), 1), "int32")
            want = np.asarray(keras_greedy(model, source))
            np.testing.assert_array_equal(out["token_ids"], want)

        return check

    for ids in (
        rng.integers(0, vocab, (3, 7)),
        np.zeros((2, 5)),
        np.zeros((0, 5)),
        np.zeros((2, 0)),
        np.zeros((0, 0)),
        rng.integers(4, vocab, (1, limit)),
    ):
        ids = np.asarray(ids, "int32")
        cases.append(
            Case(
                name,
                "translate_ids",
                {"source_ids": (ids, "int32")},
                None,
                ids_translate_check(ids),
            )
        )
    for ids, refusal in (
        ([[5, -1]], "source_ids must be >= 0"),
        ([[5, vocab]], f"source_ids must be < {vocab}"),
        (
            np.ones((1, limit + 1)),
            f"source_ids has more positions than max_source_length ({limit})",
        ),
    ):
        cases.append(Case(name, "translate_ids", {"source_ids": (ids, "int32")}, refusal))

    row = np.zeros((1, limit), "int32")
    row[0, :3] = [4, 5, 6]
    for ids in (row, np.zeros((1, limit), "int32"), np.full((1, limit), vocab - 1, "int32")):
        cases.append(Case(name, "encode", {"source_ids": (ids, "int32")}, None, _finite))
    for value, refusal in (
        (-1, "source_ids must be >= 0"),
        (vocab, f"source_ids must be < {vocab}"),
    ):
        bad = row.copy()
        bad[0, 1] = value
        cases.append(Case(name, "encode", {"source_ids": (bad, "int32")}, refusal))
    spec = model_step_specs(model)
    for token, position, refusal in (
        (2, 0, None),
        (3, length - 1, None),
        (0, 1, None),
        (-1, 0, "token must be >= 0"),
        (vocab, 0, f"token must be < {vocab}"),
        (2, -1, "position must be >= 0"),
        (2, length, f"position must be < {length}, the self_cache length"),
        (2, 10**6, f"position must be < {length}"),
    ):
        feed = {k: (np.zeros(s, "float32"), "float32") for k, s in spec.items()}
        feed["token"] = (np.array([token]), "int32")
        feed["position"] = (np.array(position), "int32")
        cases.append(Case(name, "decode_step", feed, refusal, None if refusal else _finite))
    feed_ok = {k: (np.zeros(s, "float32"), "float32") for k, s in spec.items()}
    feed_ok.update(token=(np.array([2]), "int32"), position=(np.array(0), "int32"))
    # As the model server feeds them: other ranks and sizes, refused before the model.
    cases.append(
        Case(name, "translate", {"text": (fits, "string")}, None, translate_check(fits), raw=True)
    )
    cases.append(Case(name, "decode_step", feed_ok, None, _finite, raw=True))
    for signature, name_, value, dtype, shape in (
        ("translate", "text", [["abc"]], "string", "[?]"),
        ("translate", "text", "abc", "string", "[?]"),
        ("translate_ids", "source_ids", [4, 5], "int32", "[?, ?]"),
        ("encode", "source_ids", np.ones((1, limit - 1)), "int32", f"[1, {limit}]"),
        ("encode", "source_ids", np.ones((2, limit)), "int32", f"[1, {limit}]"),
        ("decode_step", "token", [2, 3], "int32", "[1]"),
        ("decode_step", "position", [0], "int32", "[]"),
        *(("decode_step", k, np.zeros((1, *v)), "float32", str(list(v))) for k, v in spec.items()),
    ):
        feed = dict(feed_ok) if signature == "decode_step" else {}
        feed[name_] = (value, dtype)
        refusal = f"{name_} must have shape {shape}"
        cases.append(Case(name, signature, feed, refusal, raw=True))
    return cases


def _sagan_cases(generator):
    cases = []
    rng = np.random.default_rng(0)
    latent = int(generator.input["noise"].shape[-1])
    classes = int(generator.get_layer("up_8").num_classes)

    def image_check(noise, labels, uint8):
        def check(out):
            want = (
                np.clip(
                    np.asarray(generator({"noise": noise, "label": labels}, training=False)) * 0.5
                    + 0.5,
                    0,
                    1,
                )
                if len(noise)
                else np.zeros((0, *generator.output.shape[1:]), "float32")
            )
            if uint8:
                assert out["image"].dtype == np.uint8
                assert np.abs(out["image"].astype(int) - np.round(want * 255)).max(initial=0) <= 1
            else:
                np.testing.assert_allclose(out["image"], want, atol=1e-5)

        return check

    for signature in ("serving_default", "generate"):
        for n in (0, 1, 3):
            noise = rng.standard_normal((n, latent)).astype("float32")
            labels = (np.arange(n) % classes).astype("int32")
            feed = {"noise": (noise, "float32"), "label": (labels, "int32")}
            cases.append(
                Case(
                    "sagan",
                    signature,
                    feed,
                    None,
                    image_check(noise, labels, signature == "generate"),
                )
            )
        noise = np.zeros((1, latent), "float32")
        for feed, refusal in (
            ({"label": [-1]}, "label must be >= 0"),
            ({"label": [classes]}, f"label must be < {classes}, the number of classes"),
            ({"label": [0, 1]}, "noise and label must have the same number of rows"),
            ({"noise": np.full((1, latent), np.nan)}, "noise must be finite"),
            ({"noise": np.full((1, latent), -np.inf)}, "noise must be finite"),
        ):
            full = {
                "noise": (feed.get("noise", noise), "float32"),
                "label": (feed.get("label", [0]), "int32"),
            }
            cases.append(Case("sagan", signature, full, refusal))
    # As the model server feeds them: other ranks and sizes, refused before the model.
    noise, labels = rng.standard_normal((2, latent)).astype("float32"), np.array([0, 1], "int32")
    feed = {"noise": (noise, "float32"), "label": (labels, "int32")}
    cases.append(Case("sagan", "generate", feed, None, image_check(noise, labels, True), raw=True))
    for feed, refusal in (
        ({"noise": np.zeros((1, latent + 1))}, f"noise must have shape [?, {latent}]"),
        ({"noise": np.zeros(latent)}, f"noise must have shape [?, {latent}]"),
        ({"label": [[0]]}, "label must have shape [?]"),
    ):
        full = {
            "noise": (feed.get("noise", np.zeros((1, latent))), "float32"),
            "label": (feed.get("label", [0]), "int32"),
        }
        cases.append(Case("sagan", "serving_default", full, refusal, raw=True))
    return cases


def model_step_specs(model):
    """decode_step's float inputs and their shapes (export/kinds/seq2seq.step_functions)."""
    from export.kinds.seq2seq import step_functions

    _, _, specs = step_functions(model)
    return {s.name: tuple(s.shape) for s in specs["decode_step"] if s.dtype == tf.float32}


def _same_tokens(out, sentences):
    for row, sentence in zip(out["tokens"].tolist(), sentences):
        assert [t for t in row if t] == sentence.split()


def _finite(out):
    for name, value in out.items():
        assert np.isfinite(value).all(), name


@pytest.fixture(scope="module")
def answers(exports, tmp_path_factory):
    cases = (
        _tagger_cases(exports["tagger"][0])
        + _seq2seq_cases("seq2seq", exports["seq2seq"][0])
        + _seq2seq_cases("eos", exports["eos"][0], answers_eos=True)
        + _sagan_cases(exports["sagan"][0])
    )
    dirs = {name: path for name, (_, path) in exports.items()}
    path = tmp_path_factory.mktemp("cases") / "cases.json"
    path.write_text(json.dumps([dirs, [c.wire() for c in cases]]))
    proc = run_clean(_CHILD, str(path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return list(zip(cases, results))


@pytest.mark.parametrize("model", ["tagger", "seq2seq", "eos", "sagan"])
def test_every_signature_answers_as_keras_or_refuses_in_our_words(answers, model):
    checked = 0
    for case, result in answers:
        if case.model != model:
            continue
        checked += 1
        if case.refusal is None:
            assert "ok" in result, (case, result.get("error"))
            if case.check is not None:
                case.check({k: _read(v) for k, v in result["ok"].items()})
        else:
            assert "error" in result, (case, "answered instead of refusing")
            kind, message = result["error"]
            assert kind == "InvalidArgumentError" and case.refusal in message, (case, message[:600])
    assert checked >= 10


def test_detokenize_of_empty_outputs_equals_sentencepiece():
    """The in-graph decoder on rows with nothing to show (EOS first, only control ids)
    and on an empty batch: what failed as `Reduction axis 1 is empty` inside the graph."""
    from zoo.seq2seq.tokenization import train_sentencepiece

    proto = train_sentencepiece(["a man in the snow", "two dogs run"] * 20, vocab_size=30)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    graph = sentencepiece_graph.build(proto)
    for rows in ([[]], [[], []], [[0, 2, 3]], [[], [5, 6], [1]], []):
        ragged = tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1)
        assert [s.decode() for s in graph.detokenize(ragged).numpy()] == [
            sp.decode(r) for r in rows
        ]
    assert graph.detokenize(tf.zeros([2, 0], tf.int32)).numpy().tolist() == [b"", b""]


# ---------------------------------------------------------------- concurrency
def _requests(exports):
    rng = np.random.default_rng(1)
    generator = exports["sagan"][0]
    latent = int(generator.input["noise"].shape[-1])
    sentences = ["I saw a saw", "the dog can book a cat", "zzz 你好", "", "a b c d e f g"]
    texts = ["abc", "cab", "", "zzz", "bca ab", "aaaa", "😀", "ccba"]
    return {
        "tagger": [
            ("serving_default", {"sentences": tf.constant(sentences[i % 5 :] + sentences[: i % 3])})
            for i in range(8)
        ],
        "seq2seq": [("translate", {"text": tf.constant(texts[i:] + texts[:1])}) for i in range(8)],
        "sagan": [
            (
                "serving_default",
                {
                    "noise": tf.constant(rng.standard_normal((i % 3 + 1, latent)), tf.float32),
                    "label": tf.constant(np.arange(i % 3 + 1) % 2, tf.int32),
                },
            )
            for i in range(8)
        ],
    }


@pytest.mark.parametrize("kind", ["tagger", "seq2seq", "sagan"])
def test_eight_threads_at_once_answer_as_serial_calls(exports, kind):
    loaded = tf.saved_model.load(exports[kind][1])
    requests = _requests(exports)[kind]

    def call(request):
        signature, feed = request
        return {k: v.numpy() for k, v in loaded.signatures[signature](**feed).items()}

    serial = [call(r) for r in requests]
    rounds = 3
    start = threading.Barrier(len(requests))
    got = [[None] * rounds for _ in requests]
    errors = []

    def worker(i):
        try:
            start.wait()
            for r in range(rounds):
                got[i][r] = call(requests[i])
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[:2]
    for i, want in enumerate(serial):
        for answer in got[i]:
            assert answer is not None and set(answer) == set(want)
            for name in want:
                np.testing.assert_array_equal(
                    answer[name], want[name], err_msg=f"{kind} {i} {name}"
                )
