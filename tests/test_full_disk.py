"""A failed write (ENOSPC, simulated by patching the writer) leaves no partial file and
the previous version intact: step checkpoints, the SAGAN state, model.keras, the best
weights, SavedModel versions, .tflite files and their sidecars."""

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


def test_step_checkpoint_on_a_full_disk(tmp_path, disk_fills):
    from tests.train.test_checkpoint import _two_layer
    from train import checkpoint

    model = _two_layer()
    checkpoint.save(
        str(tmp_path), model, model.optimizer, {"step": 2, "epoch": 0, "batches_done": 2}
    )
    before = _state(tmp_path)
    disk_fills()
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(
            str(tmp_path), model, model.optimizer, {"step": 4, "epoch": 0, "batches_done": 4}
        )
    assert _state(tmp_path) == before  # no step-4 file, no temporary
    assert checkpoint.latest(tmp_path)[1]["step"] == 2


def test_sagan_state_on_a_full_disk(tmp_path, disk_fills):
    from tests.train.test_sagan_checkpoint import _trainer

    trainer = _trainer()
    trainer.save(str(tmp_path), {"epoch": 1})
    trainer.save(str(tmp_path), {"epoch": 2})
    before = _state(tmp_path)
    disk_fills()
    with pytest.raises(OSError, match="No space left"):
        trainer.save(str(tmp_path), {"epoch": 3})
    after = _state(tmp_path)
    # state.npz is untouched; state.prev.npz may now be a second copy of it, never partial.
    assert after["state.npz"] == before["state.npz"] and after["state.json"] == before["state.json"]
    assert set(after) == set(before)
    assert after["state.prev.npz"] in (before["state.prev.npz"], before["state.npz"])
    assert trainer.restore(str(tmp_path)) == {"epoch": 2}


def test_model_keras_and_best_weights_on_a_full_disk(tmp_path, monkeypatch):
    from tests.train.test_checkpoint import _tiny_classifier
    from train.callbacks import BEST, RunCheckpoint

    model = _tiny_classifier()
    model(np.zeros((1, 4), "float32"))
    path = str(tmp_path / "model.keras")
    atomic.save_model(model, path)
    callback = RunCheckpoint(
        str(tmp_path), {"epoch": 0, "best_val_acc": None, "best_epoch": None, "train_seconds": 0.0}
    )
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {"val_acc": 0.5})
    before = _state(tmp_path)
    assert BEST in before and "last.keras" in before
    save_model, save_weights = keras.Model.save, keras.Model.save_weights

    def partial(real):
        def write(self, filepath, *args, **kwargs):
            real(self, filepath, *args, **kwargs)
            with open(filepath, "r+b") as f:  # what landed before the disk filled up
                f.truncate(os.path.getsize(filepath) // 2)
            _full_disk()

        return write

    monkeypatch.setattr(keras.Model, "save", partial(save_model))
    monkeypatch.setattr(keras.Model, "save_weights", partial(save_weights))
    with pytest.raises(OSError, match="No space left"):
        atomic.save_model(model, path)
    with pytest.raises(OSError, match="No space left"):
        callback.on_epoch_end(1, {"val_acc": 0.9})  # a better epoch: writes best weights first
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


@pytest.mark.parametrize("fails", ["file", "record"])
def test_checked_files_on_a_full_disk(tmp_path, monkeypatch, fails):
    """last.keras / best.weights.h5 / classifier.keras (train.checkpoint.save_checked):
    the disk fills while the new file or its checksum record is written. The file in
    place and its record are untouched and still match; the previous copy is either
    unchanged or the same pair; no temporary file is left."""
    import pathlib

    from train import checkpoint

    path = str(tmp_path / "last.keras")
    for i in (1, 2):
        checkpoint.save_checked(
            path, lambda tmp, i=i: pathlib.Path(tmp).write_bytes(bytes([i]) * 500), meta={"i": i}
        )
    before = _state(tmp_path)
    if fails == "file":

        def write(tmp):
            with _FillingFile(open(tmp, "wb")) as f:
                f.write(bytes([3]) * 500)
    else:

        def write(tmp):
            pathlib.Path(tmp).write_bytes(bytes([3]) * 500)

        write_with = atomic.write_with
        monkeypatch.setattr(
            atomic,
            "write_with",
            lambda p, w, mode="wb": (
                _full_disk() if p.endswith(".sha256") else write_with(p, w, mode)
            ),
        )
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checked(path, write, meta={"i": 3})
    after = _state(tmp_path)
    assert set(after) == set(before)  # no temporary file
    assert (
        after["last.keras"] == before["last.keras"]
        and after["last.keras.sha256"] == before["last.keras.sha256"]
    )
    assert (after["last.prev.keras"], after["last.prev.keras.sha256"]) in (
        (before["last.prev.keras"], before["last.prev.keras.sha256"]),
        (before["last.keras"], before["last.keras.sha256"]),
    )
    assert checkpoint.recover(path) == ({"i": 2}, False)
