"""Tagging data readers: CoNLL-U fixtures, the embedded grammar, the real data if present."""

import pathlib

import pytest

from tests.support import paths
from train.tagger import TaggerConfig, embedded
from train.tagger.conllu import read_conllu
from train.tagger.select import load_data
from zoo.cli import DataError, UsageError

FIXTURES = pathlib.Path(paths.FIXTURES) / "tagger"
LINES = pathlib.Path(paths.SHARED) / "data" / "ud-english-lines"


def test_conllu_reader_keeps_words_only():
    sentences = read_conllu(FIXTURES / "small.conllu")
    # Written by hand from the fixture: range row 2-3 and empty node 5.1 are not words.
    assert [list(s.tokens) for s in sentences] == [
        ["I", "saw", "a", "saw", "."],
        ["I", "do", "n't", "know", "."],
        ["Sue", "likes", "coffee", "and", "Bill", "tea"],
    ]
    assert [list(s.tags) for s in sentences] == [
        ["PRON", "VERB", "DET", "NOUN", "PUNCT"],
        ["PRON", "AUX", "PART", "VERB", "PUNCT"],
        ["PROPN", "VERB", "NOUN", "CCONJ", "PROPN", "NOUN"],
    ]


def test_malformed_line_names_file_and_line():
    with pytest.raises(DataError, match=r"malformed\.conllu:9: malformed CoNLL-U line"):
        read_conllu(FIXTURES / "malformed.conllu")


@pytest.mark.parametrize(
    "row, problem",
    [
        ("x\tsaw\tsee\tVERB\t_\t_\t0\troot\t_\t_", "ID"),
        ("1\tsaw\tsee\t_\t_\t_\t0\troot\t_\t_", "UPOS"),
    ],
)
def test_bad_id_and_missing_upos(tmp_path, row, problem):
    path = tmp_path / "bad.conllu"
    path.write_text("# c\n1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_\n" + row + "\n\n")
    with pytest.raises(DataError, match=rf"bad\.conllu:3: .*{problem}"):
        read_conllu(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_conllu(tmp_path / "nope.conllu")
    with pytest.raises(DataError, match="empty data set"):
        read_conllu(FIXTURES / "empty.conllu")


def test_load_data_holds_out_missing_splits():
    data = load_data(TaggerConfig(train_file=str(FIXTURES / "small.conllu")))
    assert len(data.train) + len(data.dev) + len(data.test) == 3
    assert data.dev and data.test
    with pytest.raises(UsageError, match="need --train-file"):
        load_data(TaggerConfig(dev_file=str(FIXTURES / "small.conllu")))
    with pytest.raises(UsageError, match="tfds:NAME"):
        load_data(TaggerConfig(dataset="universal_dependencies/en_ewt"))


def test_embedded_data_is_deterministic_and_ambiguous():
    a = embedded.generate(seed=3, train_size=400, dev_size=50, test_size=80)
    b = embedded.generate(seed=3, train_size=400, dev_size=50, test_size=80)
    c = embedded.generate(seed=4, train_size=400, dev_size=50, test_size=80)
    assert a.train == b.train and a.test == b.test
    assert a.train != c.train
    train_words = {t.lower() for s in a.train for t in s.tokens}
    test_words = {t.lower() for s in a.test for t in s.tokens}
    assert test_words - train_words, "the test split must hold words unseen in training"
    tags_of = {}
    for s in a.train:
        for w, t in zip(s.tokens, s.tags):
            tags_of.setdefault(w.lower(), set()).add(t)
    assert {"NOUN", "VERB"} <= tags_of["saw"]
    assert {"ADJ", "ADV"} <= tags_of["still"]
    ambiguous = {w for w, tags in tags_of.items() if len(tags) > 1}
    assert len(ambiguous) >= 20


def test_embedded_ambiguity_reaches_beyond_a_small_window():
    """Some ambiguous words are decided by a word more than 2 positions away."""
    data = embedded.generate(seed=0, train_size=500, dev_size=10, test_size=10)
    far = 0
    for s in data.train:
        for i, (word, tag) in enumerate(zip(s.tokens, s.tags)):
            if word in embedded.AMBIGUOUS_NV and i >= 3:
                window = s.tags[i - 2 : i]
                if (
                    all(t in ("ADJ", "ADV") for t in window)
                    and s.tokens[i - 1] in embedded.AMBIGUOUS_MOD
                    and s.tokens[i - 2] in embedded.AMBIGUOUS_MOD
                ):
                    far += 1
    assert far >= 20


@pytest.mark.skipif(not LINES.is_dir(), reason="../shared/data is not present")
def test_real_treebank_counts_match_its_readme():
    sentences = read_conllu(LINES / "en_lines-ud-dev.conllu")
    # README: 1,118 sentences, 21,637 words (range rows are not words).
    assert len(sentences) == 1118
    assert sum(len(s.tokens) for s in sentences) == 21637
    assert "_" not in {t for s in sentences for t in s.tags}
