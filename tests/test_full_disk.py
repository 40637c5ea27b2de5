"""A failed write (ENOSPC, simulated by patching the writer) leaves no partial file and
the previous version intact: step and best checkpoints (SAGAN's too), model.keras,
SavedModel versions, .tflite files and their sidecars."""

import errno
import hashlib
import os

import keras
import numpy as np
import pytest

from zoo import atomic

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FillingFile:
    """A file whose writes stop with ENOSPC after `room` bytes (some bytes do land)."""

    def __init__(self, f, room=64):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            self.f.write(data[: self.room])
            self.f.flush()
            _full_disk()
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _state(directory):
    return {
        name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(directory))
        if os.path.isfile(os.path.join(directory, name))
    }


@pytest.fixture
def disk_fills(monkeypatch):
    """Makes the next file opened through os.fdopen (zoo.atomic's writer) fill up."""
    real = os.fdopen

    def fdopen(fd, *args, **kwargs):
        return _FillingFile(real(fd, *args, **kwargs))

    return lambda: monkeypatch.setattr(os, "fdopen", fdopen)


@pytest.mark.parametrize("name", ["step", "best"])
def test_checkpoint_on_a_full_disk(tmp_path, disk_fills, name):
    from tests.train.test_checkpoint import _two_layer
    from train import checkpoint

    model = _two_layer()
    groups = {"model": model.variables}
    checkpoint.save(str(tmp_path), groups, {"step": 2}, name=name, keep=2)
    checkpoint.save(str(tmp_path), groups, {"step": 3}, name=name, keep=2)
    before = _state(tmp_path)
    disk_fills()
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(str(tmp_path), groups, {"step": 4}, name=name, keep=2)
    assert _state(tmp_path) == before  # no step-4 file, no temporary, none pruned
    assert checkpoint.latest(tmp_path, name)[1]["step"] == 3


def test_sagan_checkpoint_on_a_full_disk(tmp_path, disk_fills):
    from tests.train.test_sagan_distributed import _tiny_trainer
    from train import checkpoint

    trainer = _tiny_trainer(with_ema=True)
    for step in (1, 2):
        checkpoint.save(str(tmp_path), trainer.variables(), {"step": step}, refs=trainer.refs())
    before = _state(tmp_path)
    disk_fills()
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(str(tmp_path), trainer.variables(), {"step": 3}, refs=trainer.refs())
    assert _state(tmp_path) == before
    path, record, _ = checkpoint.latest(tmp_path)
    assert record == {"step": 2}
    checkpoint.restore(path, _tiny_trainer(with_ema=True).variables(), refs=trainer.refs())


def test_model_keras_on_a_full_disk(tmp_path, monkeypatch):
    from tests.train.test_checkpoint import _tiny_classifier

    model = _tiny_classifier()
    model(np.zeros((1, 4), "float32"))
    path = str(tmp_path / "model.keras")
    atomic.save_model(model, path)
    before = _state(tmp_path)
    save_model = keras.Model.save

    def partial(self, filepath, *args, **kwargs):
        save_model(self, filepath, *args, **kwargs)
        with open(filepath, "r+b") as f:  # what landed before the disk filled up
            f.truncate(os.path.getsize(filepath) // 2)
        _full_disk()

    monkeypatch.setattr(keras.Model, "save", partial)
    with pytest.raises(OSError, match="No space left"):
        atomic.save_model(model, path)
    assert _state(tmp_path) == before
    monkeypatch.setattr(keras.Model, "save", save_model)
    keras.models.load_model(path)  # the previous model.keras still loads


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    from tests.support.runs import make_dense_model

    return make_dense_model(), tmp_path_factory.mktemp("full_disk_export")


def test_savedmodel_version_on_a_full_disk(dense, monkeypatch):
    from export import savedmodel

    model, root = dense
    base = root / "serving" / "dense"
    first = savedmodel.export_savedmodel(model, str(base))
    before = {name: _state(os.path.join(base, name)) for name in os.listdir(base)}
    from export import warmup

    def fills(directory, *args, **kwargs):  # after the SavedModel: the warm-up file does not fit
        os.makedirs(os.path.join(directory, "assets.extra"), exist_ok=True)
        with open(os.path.join(directory, "assets.extra", "tf_serving_warmup_requests"), "wb") as f:
            f.write(b"\x00" * 10)
        _full_disk()

    monkeypatch.setattr(warmup, "write", fills)
    with pytest.raises(OSError, match="No space left"):
        savedmodel.export_savedmodel(model, str(base))
    assert {name: _state(os.path.join(base, name)) for name in os.listdir(base)} == before
    assert sorted(os.listdir(base)) == [os.path.basename(first)]  # no temporary, no lock


def test_tflite_and_sidecar_on_a_full_disk(dense, monkeypatch):
    """Every file of the export stays as it was: none is written unless all are."""
    from export import tflite

    model, root = dense
    out = root / "tflite" / "dense.tflite"
    tflite.export_tflite(model, str(out))
    before = _state(out.parent)
    # The model, its sidecar and the app files beside them (export.bundle).
    assert {"dense.tflite", "dense.tflite.json", "dense.model_card.json"} <= set(before)
    real_open = open

    def filling_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return _FillingFile(f) if "w" in mode else f

    monkeypatch.setattr(tflite, "open", filling_open, raising=False)
    with pytest.raises(OSError, match="No space left"):
        tflite.export_tflite(model, str(out), quantize="fp16")
    assert _state(out.parent) == before
