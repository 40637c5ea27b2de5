"""zoo.tagger.model: the Tagger contract (encoding rules, masking, save/load, attention scores)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from zoo.tagger.layers import Presence, WordDropout
from zoo.tagger.model import Tagger, pad_tokens

WORDS = ["<pad>", "<unk>", "i", "saw", "a", "the", "00"]
CHARS = ["<pad>", "<unk>", "I", "s", "a", "w", "t", "h", "e", "1", "é"]
TAGS = ["PRON", "VERB", "DET", "NOUN", "NUM"]
SMALL = dict(word_dim=8, char_dim=4, char_filters=6, hidden_dim=16, num_heads=2)


def build(arch, **kwargs):
    keras.utils.set_random_seed(1)
    return zoo.build(
        "tagger", words=WORDS, chars=CHARS, tags=TAGS, arch=arch, max_chars=5, **{**SMALL, **kwargs}
    )


def reference_encode(tokens, words, chars, max_chars):
    """The documented rules, in plain Python."""
    word_ids, char_ids = [], []
    for tok in tokens:
        if tok == "":
            word_ids.append(0)
            char_ids.append([0] * max_chars)
            continue
        key = re.sub("[0-9]", "0", tok.lower())
        word_ids.append(words.index(key) if key in words else 1)
        ids = [chars.index(c) if c in chars else 1 for c in tok][:max_chars]
        char_ids.append(ids + [0] * (max_chars - len(ids)))
    return word_ids, char_ids


def test_registry():
    assert "tagger" in zoo.names()
    with pytest.raises(ValueError, match="unknown zoo model"):
        zoo.build("nope")


@pytest.mark.slow
def test_encode_tf_matches_the_documented_rules():
    model = build("fc")
    rows = [
        ["I", "SAW", "a", "Saws", "12", "thé", "zebra", "ééééééé"],
        ["The", "saw", "", "", "", "", "", ""],
    ]
    ids = model.encode_tf(tf.constant(rows))
    for row, w, c in zip(rows, ids["word_ids"].numpy(), ids["char_ids"].numpy()):
        ref_w, ref_c = reference_encode(row, WORDS, CHARS, 5)
        assert w.tolist() == ref_w
        assert c.tolist() == ref_c
    ragged = model.encode_tf(tf.ragged.constant([["I", "saw"], ["a"]]))
    assert ragged["word_ids"].numpy().tolist() == [[2, 3], [4, 0]]
    assert ids["word_ids"].dtype == tf.int32 and ids["char_ids"].dtype == tf.int32


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["attention", "fc", "window", "bilstm"])
def test_archs_share_the_contract_and_ignore_padding(arch):
    model = build(arch)
    assert isinstance(model, Tagger) and model.arch == arch
    assert sorted(model.core.input) == ["char_ids", "word_ids"]
    short = model.encode_tf(pad_tokens([["I", "saw", "a", "saw"]]))
    long = model.encode_tf(pad_tokens([["I", "saw", "a", "saw"] + [""] * 5]))
    p_short = model(short).numpy()
    p_long = model.core(long).numpy()
    assert p_long.shape == (1, 9, len(TAGS))
    np.testing.assert_allclose(p_short.sum(-1), 1.0, rtol=1e-5)
    # Padding must not change the real tokens' probabilities.
    np.testing.assert_allclose(p_long[:, :4], p_short, atol=1e-5)
    pairs = model.tag("I saw a saw")[0]
    assert [w for w, _ in pairs] == ["I", "saw", "a", "saw"]
    assert all(t in TAGS for _, t in pairs)


def test_fc_cannot_tell_the_two_saws_apart():
    model = build("fc")
    probs = model.core(model.encode_tf(pad_tokens([["I", "saw", "a", "saw"]]))).numpy()[0]
    np.testing.assert_allclose(probs[1], probs[3], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["attention", "bilstm"])
def test_save_load_round_trip(tmp_path, arch):
    model = build(arch)
    x = model.encode_tf(pad_tokens([["I", "saw", "a", "saw"], ["the", "zebra"]]))
    expected = model(x).numpy()
    path = str(tmp_path / "tagger.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, Tagger)
    assert (loaded.words, loaded.chars, loaded.tags) == (model.words, model.chars, model.tags)
    np.testing.assert_allclose(loaded(x).numpy(), expected, atol=1e-6)
    assert loaded.tag(["I saw a saw", "the zebra"]) == model.tag(["I saw a saw", "the zebra"])


@pytest.mark.slow
def test_attention_scores_are_distributions_over_real_words():
    model = build("attention", num_layers=2)
    scores = model.attention_scores(["I", "saw", "a", "saw"])
    assert len(scores) == 2
    for block in scores:
        assert block.shape == (2, 4, 4)
        np.testing.assert_allclose(block.sum(-1), 1.0, rtol=1e-5)
    assert build("bilstm").attention_scores(["I", "saw"]) == []


@pytest.mark.slow
def test_word_dropout():
    ids = np.array([[5, 6, 7, 8, 0, 0]] * 2000, "int32")
    layer = WordDropout(0.3, seed=0)
    np.testing.assert_array_equal(layer(ids), ids)
    out = np.asarray(layer(ids, training=True))
    assert (out[:, 4:] == 0).all()
    dropped = (out[:, :4] == 1).mean()
    assert abs(dropped - 0.3) < 0.02


@pytest.mark.slow
def test_presence_layer_standard_checks_and_values():
    from tests.support.harness import run_layer_test

    ids = np.array([[[3, 0, 1], [0, 0, 0]], [[2, 2, 4], [1, 0, 0]]], "int32")
    run_layer_test(Presence, {"size": 5}, ids, expected_output_shape=(2, 2, 3), run_training=False)
    np.testing.assert_array_equal(np.asarray(Presence(5)(ids)), (ids > 0).astype("float32"))
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="size"):
            Presence(bad)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"arch": "cnn"}, "arch"),
        ({"hidden_dim": 0}, "hidden_dim"),
        ({"dropout": 1.5}, "dropout"),
        ({"words": ["a", "b"]}, "words"),
        ({"tags": []}, "tags"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    args = dict(words=WORDS, chars=CHARS, tags=TAGS, arch="fc")
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        zoo.build("tagger", **args)


@pytest.mark.slow
def test_tag_rejects_sentences_longer_than_max_len():
    model = zoo.build("tagger", words=WORDS, chars=CHARS, tags=TAGS, arch="fc", max_len=3, **SMALL)
    with pytest.raises(ValueError, match="max_len=3"):
        model.tag("I saw a saw")
