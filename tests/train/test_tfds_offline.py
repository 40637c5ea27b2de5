"""A tensorflow-datasets set that cannot be downloaded (no network) is one DataError
line naming the set, for every command that reads tfds (train.tfds.prepare); the
tagger's and seq2seq's readers of a prepared set (a fake one here) share its splits."""

import types

import pytest

from train.tagger.types import TaggedSentence
from zoo.cli import DataError


class _Offline:
    def download_and_prepare(self):
        raise OSError("Temporary failure in name resolution\nsecond line")


def test_sagan_images_offline_is_one_data_error(monkeypatch):
    from train import tfds
    from train.sagan.images import load_tfds_images

    monkeypatch.setattr(tfds, "open_builder", lambda name, data_dir=None: _Offline())
    with pytest.raises(DataError) as error:
        load_tfds_images("tfds:mnist")
    assert str(error.value) == (
        "cannot download/prepare tfds data set 'mnist' (offline?): "
        "Temporary failure in name resolution"
    )


def test_an_error_without_a_message_is_named_by_its_type():
    from train import tfds

    class Silent:
        def download_and_prepare(self):
            raise TimeoutError()

    with pytest.raises(DataError, match=r"'en_ewt' \(offline\?\): TimeoutError$"):
        tfds.prepare(Silent(), "en_ewt")


class _Builder:
    """A prepared tfds set of `splits` (name -> rows), as tfds.as_numpy yields them."""

    def __init__(self, splits, features=None):
        self.splits = splits
        self.info = types.SimpleNamespace(
            splits=dict.fromkeys(splits), supervised_keys=("en", "fr"), features=features or {}
        )

    def download_and_prepare(self):
        pass

    def as_dataset(self, split, as_supervised=False):
        return self.splits[split]


def test_both_readers_take_validation_as_dev_and_refuse_a_set_without_train(monkeypatch):
    import tensorflow_datasets

    from train import tfds
    from train.seq2seq.parallel import load_tfds as load_pairs

    monkeypatch.setattr(tensorflow_datasets, "as_numpy", lambda rows: rows)
    rows = {"train": [(b" a ", b"b"), (b"c", b" ")], "validation": [(b"d", b"e")]}
    monkeypatch.setattr(tfds, "open_builder", lambda name: _Builder(rows))
    splits, source = load_pairs("pairs")
    assert splits == {"train": [("a", "b")], "dev": [("d", "e")]}  # empty sides dropped
    assert source == {"name": "tfds:pairs", "supervised_keys": ["en", "fr"]}

    upos = types.SimpleNamespace(feature=types.SimpleNamespace(names=["NOUN", "_"]))
    tagged = [{"tokens": [b"saw", b"-"], "upos": [0, 1]}]
    builder = _Builder({"train": tagged, "test": tagged}, {"tokens": None, "upos": upos})
    monkeypatch.setattr(tfds, "open_builder", lambda name: builder)
    data = tfds.load_tfds("tags")
    assert data.train == data.test == [TaggedSentence(("saw",), ("NOUN",))]  # "_": no word
    assert data.dev is None  # held out from train later

    del builder.splits["train"], builder.info.splits["train"]
    for load in (load_pairs, tfds.load_tfds):
        with pytest.raises(DataError, match=r"^tfds data set 'nothing' has no train split$"):
            load("nothing")
