"""Stock-server SavedModels (#17): the seq2seq string signatures tokenize with
SentencePiece rebuilt from core TensorFlow ops (zoo.seq2seq.sentencepiece_graph),
giving the `sentencepiece` package's ids and strings; and every model kind's
SavedModel loads and answers in a fresh process in which `tensorflow_text`
cannot be imported, as the stock `tensorflow_model_server` (which lacks its
SentencePiece kernels) would run it, equal to the Python model."""

import gzip
import json
import os

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import zoo
import zoo.models  # noqa: F401
from export.savedmodel import export_savedmodel
from tests.support.paths import ROOT
from tests.support.runs import SENTENCES, make_tagger_run, run_clean
from tests.support.text_seq2seq import shared_export, text_seq2seq_model, text_tokenizer
from zoo.seq2seq import sentencepiece_graph
from zoo.seq2seq.tokenization import encode_proto, train_sentencepiece

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

MULTI30K = os.path.join(
    ROOT,
    "..",
    "shared",
    "data",
    "multi30k-en-fr",
)

# Strings that exercise the normalizer: whitespace runs and kinds, full-width
# and compatibility characters (NFKC), combining sequences (multi-character
# rules), literal U+2581, characters no piece covers (<unk> runs), empties.
HARD = [
    "",
    "   ",
    "  two  dogs  ",
    "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ",
    "e\u0301te\u0301 cafe\u0301",
    "tab\there\nnewline",
    "\u2581x\u2581",
    "x \u2581",
    "日本語のテキスト",
    "\ufdfa ok",
    "a\u00a8b",
    "\u200bzero width",
    "über Straße ½ ﬁn",
    "  \u00a0 lead",
    "A MAN, 42 dogs!",
    "ǅemal Ⅻ ㎏ ﬀ",
    "\u3000\u3000",
    "x\u0308\u0301y",
    "«guillemets» — ‘quotes’",
]


def _read(name):
    with gzip.open(os.path.join(MULTI30K, name), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _graph_ids(graph, texts, batch=512):
    fn = tf.function(lambda t: graph.tokenize(t).to_tensor(default_value=-1))
    out = []
    for i in range(0, len(texts), batch):
        out += [
            [int(x) for x in row if x >= 0] for row in fn(tf.constant(texts[i : i + batch])).numpy()
        ]
    return out


def _check_against_sentencepiece(proto, texts):
    sp = spm.SentencePieceProcessor(model_proto=proto)
    graph = sentencepiece_graph.build(proto)
    want = sp.encode(texts)
    got = _graph_ids(graph, texts)
    wrong = [(texts[i], got[i], want[i]) for i in range(len(texts)) if got[i] != want[i]]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, e.g. {wrong[:3]}"
    normalized = [s.decode() for s in graph.normalize(tf.constant(texts[-len(HARD) :])).numpy()]
    assert normalized == [sp.normalize(t) for t in texts[-len(HARD) :]]
    decoded = [
        s.decode() for s in graph.detokenize(tf.ragged.constant(want, dtype=tf.int32)).numpy()
    ]
    assert decoded == sp.decode(want)
    # Control pieces (<pad>, <s>, </s>) and <unk> anywhere in a row.
    mixed = [[2, 0] + row[:1] + [1, 3] + row[1:] + [1, 0] for row in want[:50]] + [
        [1] + want[0],
        [3, 3],
    ]
    decoded = [
        s.decode() for s in graph.detokenize(tf.ragged.constant(mixed, dtype=tf.int32)).numpy()
    ]
    assert decoded == sp.decode(mixed)
    return want


def test_unigram_nfkc_ids_equal_sentencepiece_on_multi30k():
    if not os.path.isdir(MULTI30K):
        pytest.skip("no ../shared/data/multi30k-en-fr")
    train = _read("train.en.gz")[:6000] + _read("train.fr.gz")[:6000]
    proto = train_sentencepiece(train, vocab_size=2000)
    tests = [
        t
        for name in ("test_2016_flickr.en.gz", "test_2016_flickr.fr.gz", "val.en.gz", "val.fr.gz")
        for t in _read(name)
    ]
    want = _check_against_sentencepiece(proto, tests + HARD)
    # The test sets need the normalizer and hit unknown characters: not a vacuous check.
    sp = spm.SentencePieceProcessor(model_proto=proto)
    assert any(sp.normalize(t) != "\u2581" + t.replace(" ", "\u2581") for t in tests)
    assert any(1 in row for row in want)


def test_char_and_small_unigram_models_of_the_embedded_tasks_equal_sentencepiece():
    from train.seq2seq import algorithmic

    texts = []
    for task in ("copy", "reverse", "sort", "addition", "date"):
        train, _, (test,) = algorithmic.splits(task, 200, (1, 8), [(1, 8)], 300, seed=0)
        texts += [s for pair in train + test for s in pair]
    char = train_sentencepiece(
        texts, vocab_size=64, model_type="char", normalization="identity", add_dummy_prefix=False
    )
    _check_against_sentencepiece(char, texts[:400] + [" a  b ", "zz\t?"] + HARD)
    words = [
        "a man in a blue shirt is standing on a ladder",
        "une femme lit un livre dans le parc",
        "two dogs are playing in the snow",
        "des enfants jouent au football",
    ] * 20
    _check_against_sentencepiece(train_sentencepiece(words, vocab_size=60), words[:4] + HARD)


def test_ties_break_as_sentencepiece_breaks_them():
    """Every piece scored -(its length): every segmentation of a word ties, so
    the ids are the library's tie-break alone (the earliest-starting piece)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(
        train_sentencepiece(
            ["a man in a blue shirt is standing on a ladder", "two dogs are playing in the snow"]
            * 20,
            vocab_size=60,
        )
    )
    for piece in model.pieces:
        if piece.type == 1:
            piece.score = -float(len(piece.piece))
    texts = ["a man in a blue shirt", "two dogs are standing", "snowman ladders", "in the snow"]
    _check_against_sentencepiece(model.SerializeToString(), texts + HARD)


MALFORMED = [
    b"\xff\xfeabc",
    b"caf\xc3",
    b"a\xe2\x96b",
    b"\xc3\xa9\x80x",
    b"\xef\xbf\xbd ok",
    b"\xf0\x9f\x98 x",
    b"\xed\xa0\x80z",
    b"\xc0\xafq",
    b"  \xff  ",
]


def test_malformed_utf8_reads_as_sentencepiece_reads_it():
    """One U+FFFD per malformed byte, written past the character map (a literal
    U+FFFD goes through it: nmt_nfkc deletes it)."""
    for proto in (
        train_sentencepiece(["two dogs", "caf\u00e9 \u00fcber \ufffd"] * 20, vocab_size=30),
        train_sentencepiece(
            ["abc+12", "ba+3"] * 10,
            vocab_size=64,
            model_type="char",
            normalization="identity",
            add_dummy_prefix=False,
        ),
    ):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        graph = sentencepiece_graph.build(proto)
        assert graph.tokenize(tf.constant(MALFORMED)).to_list() == [sp.encode(b) for b in MALFORMED]
        assert graph.normalize(tf.constant(MALFORMED)).numpy().tolist() == [
            sp.normalize(b) for b in MALFORMED
        ]


def test_unsupported_models_are_named():
    bpe = train_sentencepiece(
        ["two dogs run", "un chien court"] * 20, vocab_size=30, model_type="bpe"
    )
    with pytest.raises(NotImplementedError, match="BPE"):
        sentencepiece_graph.build(bpe)


# ---------------------------------------------------------------- every kind, no tensorflow_text
_CHILD = r"""
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow_text":
            raise ImportError("tensorflow_text is blocked: the stock model server lacks its kernels")

sys.meta_path.insert(0, Block())
import numpy as np
import tensorflow as tf
try:
    import tensorflow_text  # noqa: F401
    raise SystemExit("the block failed")
except ImportError:
    pass

dirs, texts, sentences, feed = json.loads(sys.argv[1])
out = {}
tagger = tf.saved_model.load(dirs["tagger"])
out["tagger"] = tagger.signatures["serving_default"](sentences=tf.constant(sentences))["tags"].numpy()
for kind in ("seq2seq", "universal_transformer"):
    loaded = tf.saved_model.load(dirs[kind])
    for name in ("translate", "serving_default"):
        result = loaded.signatures[name](text=tf.constant(texts))
        out[kind + "/" + name] = [s.decode() for s in result["translation"].numpy()]
        out[kind + "/" + name + "/ids"] = result["token_ids"].numpy().tolist()
sagan = tf.saved_model.load(dirs["sagan"])
image = sagan.signatures["serving_default"](noise=tf.constant(feed["noise"], tf.float32),
                                            label=tf.constant(feed["label"], tf.int32))["image"]
out["sagan"] = image.numpy().tolist()
out["tagger"] = [[t.decode() for t in row] for row in out["tagger"]]
bad = [m for m in sys.modules if m.split(".")[0] in ("layers", "zoo", "train", "export",
                                                          "tensorflow_text")]
assert not bad, bad
print(json.dumps(out))
"""


def text_seq2seq():
    """`text_seq2seq_model()`, its SavedModel (version directory) and the folder of its
    run, exported once per test session (tests/support/text_seq2seq.py) and shared by
    this file, the deploy tests (test_deploy_docs) and the bundle tests."""
    run, version = shared_export()
    return text_seq2seq_model(), version, os.path.dirname(run)


def test_every_kind_serves_without_tensorflow_text(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    tagger_run = str(tmp_path / "tagger")
    make_tagger_run(tagger_run)
    proto = encode_proto(text_tokenizer())
    shared, shared_version, _ = text_seq2seq()
    models = {
        "universal_transformer": zoo.build(
            "universal_transformer",
            tokenizer=proto,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
            num_steps=2,
            max_source_length=24,
            max_target_length=8,
        ),
        "sagan": zoo.build(
            "sagan_generator", image_size=32, channels=1, num_classes=3, latent_dim=8, width=4
        ),
    }
    dirs = {"tagger": export_savedmodel(tagger_run, str(tmp_path / "serving" / "tagger"))}
    for kind, model in models.items():
        dirs[kind] = export_savedmodel(model, str(tmp_path / "serving" / kind))
    models["seq2seq"], dirs["seq2seq"] = shared, shared_version
    for kind in ("seq2seq", "universal_transformer"):
        assert os.path.isfile(os.path.join(dirs[kind], "assets.extra", "spm.model"))
    texts = ["a man in the snow", "ｆｕｌｌｗｉｄｔｈ  dogs", "e\u0301te\u0301 \u65e5\u672c", ""]
    feed = {
        "noise": np.random.default_rng(0).standard_normal((3, 8)).astype("float32").tolist(),
        "label": [0, 1, 2],
    }
    sentences = [" ".join(s) for s in SENTENCES]
    result = run_clean(_CHILD, json.dumps([dirs, texts, sentences, feed]))
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])

    tagged = zoo.load(tagger_run).tag(sentences)
    assert [[tag for _, tag in row] for row in tagged] == [
        row[: len(tags)] for row, tags in zip(got["tagger"], tagged)
    ]
    from zoo.seq2seq import decoding
    from zoo.seq2seq.tokenization import cut

    for kind in ("seq2seq", "universal_transformer"):
        model = models[kind]
        ids = model.tokenizer.encode_within(texts, model.max_source_length)
        # The graph's greedy loop, run on every row ("" included: a source of padding).
        want_ids = decoding.decode_ids(model, ids)
        want = model.tokenizer.decode(want_ids)
        assert got[kind + "/translate"] == want == got[kind + "/serving_default"], kind
        assert [cut(row) for row in got[kind + "/translate/ids"]] == want_ids, kind
        # The Keras model's translate: the same where a text has ids, "" (no model run) where not.
        assert model.translate(texts) == [w if row else "" for w, row in zip(want, ids)], kind
    model = models["sagan"]
    want = np.clip(
        np.asarray(
            model(
                {
                    "noise": np.asarray(feed["noise"], np.float32),
                    "label": np.asarray(feed["label"], np.int32),
                },
                training=False,
            )
        )
        * 0.5
        + 0.5,
        0,
        1,
    )
    np.testing.assert_allclose(np.asarray(got["sagan"]), want, atol=1e-5)
