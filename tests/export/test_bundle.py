"""Self-contained export folders (#17): every export writes, beside the model,
preprocessing.json (rules + test vectors), labels, the tokenizer model and a
model card. The specs are checked by re-implementations below that read only
the JSON (and the files it names), never this project's preprocessing code:
their results equal the stored test vectors and the models' own preprocessing
on held-out strings; labels equal the models'; the cards' metrics equal the
runs' metrics.json."""

import json
import os
import re

import numpy as np
import pytest
import sentencepiece as spm

import zoo
import zoo.models  # noqa: F401
from export import bundle
from export.kinds import seq2seq as seq2seq_kind
from export.savedmodel import export_savedmodel
from export.tflite import export_tflite
from tests.support.text_seq2seq import shared_export, text_seq2seq_model

pytestmark = pytest.mark.slow  # about a minute of exports per module

WORDS = ["<pad>", "<unk>", "i", "saw", "a", "dog", "été", "straße", "0", "00", "οδος", "i̇stanbul"]
TAGS = ["PRON", "VERB", "DET", "NOUN", "NUM"]
CLASSES = ["zero", "one", "two"]
# Case, digits, non-ASCII lower-casing, Unicode whitespace, long and unknown tokens.
HELD_OUT = [
    "I SAW 7 dogs",
    "ÉTÉ 42 Straße",
    "ΟΔΟΣ İstanbul x9y",
    "a\u2003dog\u00a0saw\u3000I",
    "averyveryverylongtoken",
    "日本 ǅ 00",
]
TEXTS = ["a man in the snow", "ｆｕｌｌｗｉｄｔｈ  Dogs 42", "e\u0301te\u0301", "x"]


def _run(path, kind, model, config, metrics):
    os.makedirs(path)
    model.save(os.path.join(path, "model.keras"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(dict(kind=kind, data={"name": f"tiny-{kind}", "licence": "CC0"}, **config), f)
    with open(os.path.join(path, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    import keras

    base = tmp_path_factory.mktemp("bundle")
    keras.utils.set_random_seed(5)
    chars = ["<pad>", "<unk>"] + sorted(set("".join(WORDS[2:]) + "ISAWÉΟΔΣİ"))
    tagger = zoo.build(
        "tagger", words=WORDS, chars=chars, tags=TAGS, max_chars=8, max_len=16,
        word_dim=8, char_dim=4, char_filters=4, hidden_dim=8, num_heads=2,
    )  # fmt: skip
    tagger_run = _run(
        str(base / "tagger-run"),
        "tagger",
        tagger,
        {"model": {"arch": "attention"}, "train": {}},
        {"test_accuracy": 0.5, "test_oov_accuracy": 0.25, "dev_accuracy": 0.75, "params": 1},
    )
    # The text seq2seq run and its SavedModel are the session's shared ones (the stock
    # serving and deploy tests serve the same export): written as `_run` writes a run,
    # with data tiny-seq2seq (CC0) and the metrics that test_model_cards expects.
    translator = text_seq2seq_model()
    s2s_run, s2s_version = shared_export()
    generator = zoo.build(
        "sagan_generator", image_size=32, channels=1, num_classes=3, latent_dim=8, width=4
    )
    sagan_run = _run(
        str(base / "sagan-run"),
        "sagan",
        generator,
        {"model": {"num_classes": 3}, "class_names": CLASSES, "train": {}},
        {"fid": 12.5, "kid": 0.0125, "fid_floor": 3.5, "class_accuracy": 0.875, "epochs": 2},
    )
    out = base / "out"
    dirs = {
        "tagger_sm": export_savedmodel(tagger_run, str(out / "serving" / "tagger")),
        "s2s_sm": s2s_version,
        "sagan_sm": export_savedmodel(sagan_run, str(out / "serving" / "sagan")),
    }
    export_tflite(tagger_run, str(out / "lite" / "tagger.tflite"), quantize="fp16")
    export_tflite(sagan_run, str(out / "lite" / "sagan.tflite"))
    export_tflite(s2s_run, str(out / "lite" / "greedy.tflite"))
    seq2seq_kind.export_all(s2s_run, str(out / "mt-tflite"))
    return {
        "runs": {"tagger": tagger_run, "seq2seq": s2s_run, "sagan": sagan_run},
        "models": {"tagger": tagger, "seq2seq": translator, "sagan": generator},
        "dirs": dirs,
        "lite": str(out / "lite"),
        "steps": str(out / "mt-tflite"),
    }


def _bundles(exports):
    """(kind, folder, file-name prefix) of every export the fixture wrote."""
    return [
        ("tagger", exports["dirs"]["tagger_sm"], ""),
        ("seq2seq", exports["dirs"]["s2s_sm"], ""),
        ("sagan", exports["dirs"]["sagan_sm"], ""),
        ("tagger", exports["lite"], "tagger."),
        ("sagan", exports["lite"], "sagan."),
        ("seq2seq", exports["lite"], "greedy."),
        ("seq2seq", exports["steps"], ""),
    ]


def _json(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- independent readers
def _vocab(folder, ref):
    return _json(folder, ref["file"])[ref["key"]]


def spec_tagger_ids(folder, spec, text):
    """The tagger spec, re-implemented from preprocessing.json alone."""
    space = {chr(c) for c in spec["tokenize"]["whitespace"]}
    tokens = [t for t in re.split("[" + re.escape("".join(sorted(space))) + "]+", text) if t]
    assert len(tokens) <= spec["tokenize"]["max_tokens"]
    w, c = spec["word_ids"], spec["char_ids"]
    assert w["normalize"] == ["lowercase", "fold_digits"]
    words = {x: i for i, x in enumerate(_vocab(folder, w["vocabulary"])) if i >= 2}
    chars = {x: i for i, x in enumerate(_vocab(folder, c["vocabulary"])) if i >= 2}
    word_ids = [words.get(re.sub("[0-9]", "0", t.lower()), w["unknown_id"]) for t in tokens]
    char_ids = []
    for t in tokens:
        row = [chars.get(ch, c["unknown_id"]) for ch in t][: c["max_chars"]]
        char_ids.append(row + [c["pad_id"]] * (c["max_chars"] - len(row)))
    return {"tokens": tokens, "word_ids": word_ids, "char_ids": char_ids}


def spec_seq2seq_ids(folder, spec, text):
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, spec["tokenizer"]["file"]))
    return list(sp.encode(text))


def spec_sagan_inputs(folder, spec, vector):
    latent = spec["inputs"]["noise"]["shape"][1]
    if "label" in spec["inputs"]:
        with open(os.path.join(folder, spec["inputs"]["label"]["labels"]["file"])) as f:
            names = f.read().splitlines()
        labels = [names.index(c) if isinstance(c, str) else c for c in vector["class_ids"]]
    else:
        labels = [0] * vector["num_images"]
    noise = np.random.default_rng(vector["seed"]).standard_normal((len(labels), latent))
    return noise.astype(np.float32), np.asarray(labels, np.int32)


# ---------------------------------------------------------------- tests
def test_every_export_folder_holds_the_bundle(exports):
    for kind, folder, prefix in _bundles(exports):
        names = ["preprocessing.json", "model_card.json", "MODEL_CARD.md"]
        names += ["labels.txt"] if kind != "seq2seq" else []
        for name in names:
            assert os.path.isfile(os.path.join(folder, prefix + name)), (kind, folder, name)
        spec = _json(folder, prefix + "preprocessing.json")
        assert (spec["kind"], spec["format"]) == (kind, bundle.FORMAT)
        card = _json(folder, prefix + "model_card.json")
        for name in card["files"]:  # what the card lists is there
            assert os.path.exists(os.path.join(folder, name)), (folder, name)
    # The tokenizer ships as a file in each seq2seq export: reused where there was one.
    proto = exports["models"]["seq2seq"].tokenizer.proto
    for folder, prefix, name in (
        (exports["dirs"]["s2s_sm"], "", "assets.extra/spm.model"),
        (exports["steps"], "", "spm.model"),
        (exports["lite"], "greedy.", "greedy.spm.model"),  # new beside a lone .tflite
    ):
        assert _json(folder, prefix + "preprocessing.json")["tokenizer"]["file"] == name
        with open(os.path.join(folder, name), "rb") as f:
            assert f.read() == proto
    assert not os.path.exists(os.path.join(exports["dirs"]["s2s_sm"], "spm.model"))
    # The TFLite tagger's vocabularies stay in its sidecar, which the spec names.
    spec = _json(exports["lite"], "tagger.preprocessing.json")
    assert spec["word_ids"]["vocabulary"]["file"] == "tagger.tflite.json"
    assert not os.path.exists(os.path.join(exports["lite"], "tagger.vocab.json"))


def test_tagger_spec_reproduces_the_vectors_and_the_models_ids(exports):
    from zoo.tagger.model import pad_tokens

    model = exports["models"]["tagger"]
    for folder, prefix in ((exports["dirs"]["tagger_sm"], ""), (exports["lite"], "tagger.")):
        spec = _json(folder, prefix + "preprocessing.json")
        vectors = spec["test_vectors"]
        assert len(vectors) >= 3
        for v in vectors:
            assert spec_tagger_ids(folder, spec, v["text"]) == {
                k: v[k] for k in ("tokens", "word_ids", "char_ids")
            }
        for text in HELD_OUT:
            got = spec_tagger_ids(folder, spec, text)
            want = model.encode_tf(pad_tokens([text.split()]))
            assert got["word_ids"] == np.asarray(want["word_ids"])[0].tolist(), text
            assert got["char_ids"] == np.asarray(want["char_ids"])[0].tolist(), text
    # Not vacuous: known words found through lower-casing and digit folding.
    folder = exports["dirs"]["tagger_sm"]
    spec = _json(folder, "preprocessing.json")
    ids = [spec_tagger_ids(folder, spec, t)["word_ids"] for t in HELD_OUT]
    assert {WORDS.index(w) for w in ("été", "straße", "0", "οδος", "i̇stanbul", "00")} <= {
        i for row in ids for i in row
    }


def test_seq2seq_spec_reproduces_the_vectors_and_the_models_ids(exports):
    model = exports["models"]["seq2seq"]
    for folder, prefix in (
        (exports["dirs"]["s2s_sm"], ""),
        (exports["steps"], ""),
        (exports["lite"], "greedy."),
    ):
        spec = _json(folder, prefix + "preprocessing.json")
        assert spec["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
        assert spec["source_ids"]["max_length"] == model.max_source_length
        assert spec["decoding"]["max_length"] == model.max_target_length
        for v in spec["test_vectors"]:
            assert spec_seq2seq_ids(folder, spec, v["text"]) == v["ids"]
        got = [spec_seq2seq_ids(folder, spec, t) for t in TEXTS]
        assert got == model.tokenizer.encode(TEXTS)
    # The step signatures' source length is the spec's.
    signature = _json(exports["dirs"]["s2s_sm"], "signature.json")["signatures"]["encode"]
    assert signature["inputs"]["source_ids"]["shape"] == [1, spec["source_ids"]["max_length"]]


def test_sagan_spec_reproduces_the_vectors_and_the_models_images(exports):
    generator = zoo.load(exports["runs"]["sagan"])
    for folder, prefix in ((exports["dirs"]["sagan_sm"], ""), (exports["lite"], "sagan.")):
        spec = _json(folder, prefix + "preprocessing.json")
        for v in spec["test_vectors"]:
            noise, labels = spec_sagan_inputs(folder, spec, v)
            np.testing.assert_array_equal(noise, np.asarray(v["noise"], np.float32))
            assert labels.tolist() == v["label"]
        # Held out: a seed and classes no vector uses give zoo.load's images.
        vector = {"seed": 11, "class_ids": ["two", "zero", 1]}
        noise, labels = spec_sagan_inputs(folder, spec, vector)
        want = generator.generate(vector["class_ids"], seed=11)
        got = exports["models"]["sagan"]({"noise": noise, "label": labels}, training=False)
        np.testing.assert_allclose(np.clip(np.asarray(got) * 0.5 + 0.5, 0, 1), want, atol=1e-6)


def test_labels_match_the_models(exports):
    want = {"tagger": TAGS, "sagan": CLASSES}
    for kind, folder, prefix in _bundles(exports):
        if kind == "seq2seq":
            continue
        with open(os.path.join(folder, prefix + "labels.txt"), encoding="utf-8") as f:
            assert f.read().splitlines() == want[kind], (kind, folder)
    assert exports["models"]["tagger"].tags == TAGS
    sidecar = _json(exports["lite"], "tagger.tflite.json")
    assert sidecar["tags"] == TAGS


def test_model_cards_report_the_runs_metrics(exports):
    expected = {  # what each kind reports: the test split's numbers
        "tagger": {"test_accuracy": 0.5, "test_oov_accuracy": 0.25},
        "seq2seq": {"test_bleu": 12.5, "test_chrf": 40.25},
        "sagan": {"fid": 12.5, "kid": 0.0125, "fid_floor": 3.5, "class_accuracy": 0.875},
    }
    for kind, folder, prefix in _bundles(exports):
        card = _json(folder, prefix + "model_card.json")
        metrics = _json(exports["runs"][kind], "metrics.json")
        assert card["metrics"] == {k: metrics[k] for k in expected[kind]} == expected[kind]
        assert card["data"] == {"name": f"tiny-{kind}", "licence": "CC0"}
        assert card["licence"]["model_and_code"].startswith("Apache-2.0")
        with open(os.path.join(folder, prefix + "MODEL_CARD.md"), encoding="utf-8") as f:
            text = f.read()
        for key, value in expected[kind].items():
            assert f"| {key} | {value} |" in text
        mode = "fp16" if prefix == "tagger." else "none"
        assert card["quantization"]["mode"] == mode, (kind, folder)
