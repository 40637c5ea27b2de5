"""SentencePiece tokenizer: trained from text, same ids eagerly and in-graph,
decoding stops at EOS, and it survives a SavedModel round trip."""

import numpy as np
import pytest
import tensorflow as tf

from zoo.seq2seq.tokenization import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    decode_proto,
    encode_proto,
    train_sentencepiece,
)

TEXTS = [
    "a man in a blue shirt is standing on a ladder",
    "two dogs are playing in the snow",
    "une femme lit un livre dans le parc",
    "des enfants jouent au football",
    "a woman is reading a book in the park",
    "children are playing football on the grass",
] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(train_sentencepiece(TEXTS, vocab_size=120))


@pytest.mark.slow
def test_special_ids_fixed(tokenizer):
    pieces = tokenizer.pieces()
    assert [pieces[PAD_ID], pieces[UNK_ID], pieces[BOS_ID], pieces[EOS_ID]] == [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
    ]
    assert 20 < tokenizer.vocabulary_size <= 120


def test_round_trip_and_subwords(tokenizer):
    text = ["two dogs are reading in the snow", "une femme joue"]
    ids = tokenizer.encode(text)
    assert all(i > EOS_ID for row in ids for i in row)
    assert tokenizer.decode(ids) == text
    # An unseen word is split into known pieces, not mapped to <unk>.
    assert UNK_ID not in tokenizer.encode(["snowdogs"])[0]


def test_decode_cuts_at_eos_and_skips_padding(tokenizer):
    ids = tokenizer.encode(["two dogs"])[0]
    row = [BOS_ID] + ids + [EOS_ID] + ids + [PAD_ID, PAD_ID]
    assert tokenizer.decode([row]) == ["two dogs"]


@pytest.mark.slow
def test_in_graph_matches_python(tokenizer):
    text = ["a man in the park", "des enfants jouent au football dans la neige", "x"]
    dense, counts = tokenizer.encode_tf(tf.constant(text), 12)
    expected = tokenizer.encode(text)
    assert counts.numpy().tolist() == [len(r) for r in expected]
    for row, want in zip(dense.numpy(), expected):
        assert row[: min(12, len(want))].tolist() == want[:12]
        assert (row[len(want) :] == PAD_ID).all()
    out = np.array([[*tokenizer.encode(["two dogs"])[0], EOS_ID, 9, 9]])
    assert [s.decode() for s in tokenizer.decode_tf(out).numpy()] == tokenizer.decode(out.tolist())


@pytest.mark.slow
def test_proto_travels_as_text(tokenizer):
    again = Tokenizer(decode_proto(encode_proto(tokenizer.proto)))
    assert again.encode(["two dogs"]) == tokenizer.encode(["two dogs"])


@pytest.mark.slow
def test_char_model_for_tasks():
    tok = Tokenizer(
        train_sentencepiece(
            ["abc+12", "ba+3"] * 10,
            vocab_size=64,
            model_type="char",
            normalization="identity",
            add_dummy_prefix=False,
        )
    )
    ids = tok.encode(["cab+21"])[0]
    assert len(ids) == 6 and tok.decode([ids]) == ["cab+21"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="model_type"):
        train_sentencepiece(TEXTS, model_type="wordpiece")
    with pytest.raises(ValueError, match="vocab_size"):
        train_sentencepiece(TEXTS, vocab_size=2)
    with pytest.raises(ValueError, match="no text"):
        train_sentencepiece(["", "  "])
