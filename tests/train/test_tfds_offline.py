"""A tensorflow-datasets set that cannot be downloaded (no network) is one DataError
line naming the set, for every command that reads tfds (train.tfds.prepare)."""

import pytest

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
