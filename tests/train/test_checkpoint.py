"""Nothing lost: step checkpoints, SIGKILL then --resume, NaN stops cleanly, mixed precision."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support import paths, tiny
from tests.support.runs import training_env
from train import checkpoint, engine
from train import strategy as distribute
from train.rundir import read_json
from train.tagger import embedded

ROOT = pathlib.Path(paths.ROOT)
TINY = tiny.TAGGER_MINI_MODEL


@pytest.fixture(autouse=True)
def one_device():
    distribute.reset()
    yield
    distribute.reset()


def _tiny_classifier():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def _batches(n, nan_at=None, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=(6, 4)).astype("float32")
        if i == nan_at:
            x[2, 1] = np.nan
        out.append((x, rng.integers(0, 3, size=(6,)).astype("int32"), np.ones((6,), "float32")))
    return out


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    model = _tiny_classifier()
    ckpt = tmp_path / "checkpoints"
    with pytest.raises(engine.NonFiniteLoss) as info:
        engine.fit(
            model,
            _batches(8, nan_at=4),
            epochs=2,
            verbose=0,
            checkpoint_dir=str(ckpt),
            checkpoint_every=2,
        )
    message = str(info.value)
    assert "loss became nan" in message and "step 5" in message and "step-00000004.npz" in message
    assert [os.path.basename(p) for p in checkpoint.list_checkpoints(ckpt)] == [
        "step-00000002.npz",
        "step-00000004.npz",
    ]
    # The weights in memory are ruined; the checkpoint holds the last finite ones.
    assert not all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)
    fresh = _tiny_classifier()
    engine.Engine(fresh).build(_batches(1)[0])
    record = checkpoint.restore(checkpoint.path_for(ckpt, 4), fresh, fresh.optimizer)
    assert record == {**record, "step": 4, "epoch": 0, "batches_done": 4, "epoch_complete": False}
    assert all(np.isfinite(v.numpy()).all() for v in fresh.variables)
    assert int(fresh.optimizer.iterations.numpy()) == 4


def test_loss_is_summed_per_example_over_the_global_count(tmp_path):
    """One engine step == one plain SGD step on the weighted mean loss (NumPy reference)."""
    x = np.random.default_rng(1).normal(size=(5, 4)).astype("float32")
    y = np.array([0, 2, 1, 1, 0], "int32")
    w = np.array([1, 1, 0, 1, 0], "float32")  # rows with weight 0 are padding
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy()
    )
    kernel, bias = [v.numpy().copy() for v in model.trainable_variables]
    engine.fit(model, [(x, y, w)], epochs=1, verbose=0)
    logits = x @ kernel + bias
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - np.eye(3)[y]) * (w / w.sum())[:, None]  # d(sum_i w_i CE_i / sum w) / d logits
    np.testing.assert_allclose(
        model.trainable_variables[0].numpy(), kernel - 0.5 * x.T @ d, atol=1e-5
    )
    np.testing.assert_allclose(
        model.trainable_variables[1].numpy(), bias - 0.5 * d.sum(0), atol=1e-5
    )


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    model = _tiny_classifier()
    engine.fit(
        model, _batches(4), epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=2
    )
    paths = checkpoint.list_checkpoints(tmp_path)
    assert [os.path.basename(p) for p in paths] == ["step-00000002.npz", "step-00000004.npz"]
    pathlib.Path(paths[-1]).write_bytes(pathlib.Path(paths[-1]).read_bytes()[:100])
    path, record = checkpoint.latest(tmp_path)
    assert path == paths[0] and record["batches_done"] == 2


def _write_conllu(path, sentences):
    lines = []
    for s in sentences:
        for i, (tok, tag) in enumerate(zip(s.tokens, s.tags), 1):
            lines.append(f"{i}\t{tok}\t_\t{tag}\t_\t_\t_\t_\t_\t_")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _cli(out, files, *extra):
    options = [f"--model-option={k}={json.dumps(v)}" for k, v in TINY.items()]
    return [
        sys.executable,
        "-m",
        "train",
        "tagger",
        "--out",
        str(out),
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "2",
        "--seed",
        "3",
        *files,
        *options,
        *extra,
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The data files and the uninterrupted run that both kill tests compare with: the
    same command for both, so it runs once, started by the first of them beside its
    killed run. `start()` starts it (once) and returns (files, output directory);
    `wait()` waits for it (once) and asserts exit 0."""
    base = tmp_path_factory.mktemp("sigkill")
    state = {}

    def start():
        if "proc" not in state:
            state["files"] = _tagger_files(base)
            state["proc"] = subprocess.Popen(
                _cli(base / "full", state["files"]),
                cwd=ROOT,
                env=training_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        return state["files"], base / "full"

    def wait():
        proc = state["proc"]
        if "code" not in state:
            _, err = proc.communicate(timeout=240)
            state["code"], state["err"] = proc.returncode, err
        assert state["code"] == 0, state["err"][-3000:]

    yield start, wait
    proc = state.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("kill_epoch", [0, 1], ids=["first-epoch", "second-epoch"])
def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(
    tmp_path, kill_epoch, uninterrupted, capsys
):
    # Killed in the first epoch, the run has no model file yet, only step checkpoints.
    start, wait = uninterrupted
    files, full = start()
    env = training_env()
    killed = subprocess.Popen(
        _cli(tmp_path / "killed", files),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpt = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and killed.poll() is None:
            _, record = checkpoint.latest(ckpt) if ckpt.exists() else (None, None)
            if record and record["epoch"] == kill_epoch and not record["epoch_complete"]:
                killed.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        killed.wait(timeout=30)
        assert killed.returncode == -signal.SIGKILL, (
            f"the run ended before it could be killed in epoch {kill_epoch + 1}"
        )
        assert not (tmp_path / "killed" / "metrics.json").exists()
        # The resume reads only the killed run's files: it runs in this process.
        capsys.readouterr()
        assert _main(_cli(tmp_path / "killed", files, "--resume")[3:]) == 0
        err = capsys.readouterr().err
        assert "restored step-" in err and f": epoch {kill_epoch + 1}, batch " in err, err
        wait()
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    state = read_json(tmp_path / "killed" / "checkpoints" / "state.json")
    assert [h["epoch"] for h in state["history"]] == [1, 2, 3]  # none redone, none lost
    a = read_json(full / "metrics.json")
    b = read_json(tmp_path / "killed" / "metrics.json")
    for key in ("test_accuracy", "dev_accuracy", "test_unseen_accuracy"):
        assert abs(a[key] - b[key]) <= 0.01, (key, a[key], b[key])
    steps = keras.models.load_model(full / "checkpoints" / "last.keras").optimizer.iterations
    again = keras.models.load_model(
        tmp_path / "killed" / "checkpoints" / "last.keras"
    ).optimizer.iterations
    assert int(steps.numpy()) == int(again.numpy()) == 3 * 30


@pytest.mark.slow
def test_mixed_precision_tagger_and_seq2seq_train_without_nans(tmp_path):
    import argparse

    from train.cli import main
    from train.tagger.training import train_one

    keras.config.set_dtype_policy("mixed_bfloat16")
    data = embedded.generate(seed=0, train_size=64, dev_size=16, test_size=16)
    args = argparse.Namespace(
        epochs=1,
        batch_size=16,
        seed=0,
        learning_rate=None,
        max_minutes=0.0,
        ema_momentum=None,
        model_options=dict(TINY),
        train_file=None,
        dev_file=None,
        test_file=None,
        dataset=None,
        out=None,
        resume=False,
    )
    train_one(args, data, "attention", str(tmp_path / "tagger"), verbose=0)
    history = read_json(tmp_path / "tagger" / "checkpoints" / "state.json")["history"]
    assert np.isfinite(history[0]["loss"]) and np.isfinite(history[0]["val_loss"])
    model = keras.models.load_model(tmp_path / "tagger" / "model.keras")
    assert any(layer.dtype_policy.name == "mixed_bfloat16" for layer in model.core.layers)
    keras.config.set_dtype_policy("float32")
    out = tmp_path / "seq2seq"
    assert (
        main(
            [
                "seq2seq",
                "--task",
                "reverse",
                "--train-size",
                "64",
                "--epochs",
                "1",
                "--hidden-dim",
                "16",
                "--num-layers",
                "1",
                "--num-heads",
                "2",
                "--intermediate-dim",
                "32",
                "--dev-sample",
                "0",
                "--verbose",
                "0",
                "--out",
                str(out),
                "--mixed-precision",
                "--strategy",
                "default",
            ]
        )
        == 0
    )
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    history = read_json(out / "checkpoints" / "state.json")["history"]
    assert np.isfinite(history[0]["loss"]) and np.isfinite(history[0]["val_loss"])


# ---------------------------------------------------------------------------
# Checkpoints keyed by variable path, with the config hash and a checksum.


class _Pair(keras.Model):
    """Two same-shaped Dense layers, `first` then `second`; `order` is the order in which
    they are created, which is the order of `variables` (what positions used to key)."""

    def __init__(self, order=("first", "second"), activation="relu", names=None, **kwargs):
        super().__init__(**kwargs)
        names = names or {}
        self.order, self.activation = tuple(order), activation
        for n in order:  # attribute order is variable order
            setattr(self, n, keras.layers.Dense(4, activation=activation, name=names.get(n, n)))

    def call(self, x):
        return self.second(self.first(x))

    def get_config(self):
        return {"activation": self.activation}


def _two_layer(order=("first", "second"), activation="relu", names=None):
    model = _Pair(order, activation, names, name="pair")
    model(np.zeros((1, 4), "float32"))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _randomise(model, seed):
    rng = np.random.default_rng(seed)
    for v in model.variables:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))


def test_restore_goes_by_path_not_position(tmp_path):
    a = _two_layer(("first", "second"))
    _randomise(a, 0)
    path = checkpoint.save(
        str(tmp_path), a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1}
    )
    b = _two_layer(("second", "first"))  # same layers, created in the other order
    assert "second/" in b.trainable_variables[0].path and "first/" in a.trainable_variables[0].path
    checkpoint.restore(path, b, b.optimizer)
    for name in ("first", "second"):
        for x, y in zip(getattr(a, name).weights, getattr(b, name).weights):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    x = np.random.default_rng(1).normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(a(x)), np.asarray(b(x)), atol=1e-6)


def test_a_renamed_variable_is_refused_naming_it_and_nothing_is_assigned(tmp_path):
    a = _two_layer()
    path = checkpoint.save(
        str(tmp_path), a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1}
    )
    b = _two_layer(names={"second": "third"})
    before = [v.numpy().copy() for v in b.variables]
    with pytest.raises(
        checkpoint.UsageError,
        match=r"model variable '[a-z_0-9]*/?third/kernel' is not in the checkpoint",
    ):
        checkpoint.restore(path, b, b.optimizer)
    assert all(np.array_equal(x, v.numpy()) for x, v in zip(before, b.variables))


def test_a_changed_shape_is_refused_naming_the_variable(tmp_path):
    a = _tiny_classifier()
    engine.Engine(a).build(_batches(1)[0])
    path = checkpoint.save(
        str(tmp_path), a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1}
    )
    b = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    b.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    b.optimizer.build(b.trainable_variables)
    with pytest.raises(
        checkpoint.UsageError,
        match=r"'[a-z_0-9/]*dense(_\d+)?/kernel' has shape \(4, 3\) there, \(5, 3\) here",
    ):
        checkpoint.restore(path, b, b.optimizer)


def test_another_model_configuration_is_refused(tmp_path):
    a = _two_layer(activation="relu")
    path = checkpoint.save(
        str(tmp_path), a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1}
    )
    b = _two_layer(activation="tanh")  # same variables, another function
    with pytest.raises(checkpoint.UsageError, match="another model configuration"):
        checkpoint.restore(path, b, b.optimizer)
    c = _two_layer(activation="relu")  # control: the same configuration restores
    checkpoint.restore(path, c, c.optimizer)


def _positional_save(path, model, optimizer, record):
    """The first checkpoint format, as it was written before the keys were paths."""
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
    arrays.update(
        {f"optimizer/{i}": np.asarray(v.numpy()) for i, v in enumerate(optimizer.variables)}
    )
    arrays["record"] = np.frombuffer(json.dumps(record).encode("utf-8"), dtype=np.uint8)
    np.savez(path, **arrays)


def test_a_positional_checkpoint_still_restores_and_says_so(tmp_path, capsys):
    a = _two_layer()
    _randomise(a, 2)
    path = str(tmp_path / "step-00000001.npz")
    _positional_save(path, a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1})
    assert checkpoint.latest(tmp_path)[0] == path
    b = _two_layer()
    record = checkpoint.restore(path, b, b.optimizer)
    assert record["step"] == 1
    assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.variables, b.variables))
    assert "positional checkpoint" in capsys.readouterr().err


def test_a_member_changed_behind_the_zip_crc_fails_the_checksum(tmp_path):
    """Re-zipped with one changed value (valid CRCs): only the SHA-256 can tell."""
    import zipfile

    a = _two_layer()
    path = checkpoint.save(
        str(tmp_path), a, a.optimizer, {"step": 1, "epoch": 0, "batches_done": 1}
    )
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    key = next(k for k in arrays if k.endswith("first/kernel"))
    arrays[key] = arrays[key] + 1.0
    np.savez(path, **arrays)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    with pytest.raises(checkpoint.DamagedCheckpoint, match="SHA-256"):
        checkpoint.restore(path, a, a.optimizer)


def test_resume_falls_back_past_a_damaged_checkpoint_and_says_so(tmp_path, capsys):
    model = _tiny_classifier()
    engine.fit(
        model, _batches(6), epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=2
    )
    paths = checkpoint.list_checkpoints(tmp_path)
    assert [os.path.basename(p) for p in paths] == [
        "step-00000002.npz",
        "step-00000004.npz",
        "step-00000006.npz",
    ]
    data = pathlib.Path(paths[-1]).read_bytes()
    pathlib.Path(paths[-1]).write_bytes(data[: len(data) * 3 // 5])
    capsys.readouterr()
    resumed = _tiny_classifier()
    engine.fit(
        resumed, _batches(6), epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=2
    )
    err = capsys.readouterr().err
    assert "step-00000006.npz" in err and "falling back to step-00000004.npz" in err
    assert "restored step-00000004.npz: epoch 1, batch 4" in err
    # It retrained batches 5 and 6 into equal weights (same data, same optimizer state).
    for x, y in zip(model.variables, resumed.variables):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-6)


@pytest.mark.slow
def test_resume_into_a_changed_model_is_refused_with_one_line_and_exit_2(
    tmp_path, capsys, monkeypatch
):
    """End to end: a tagger stopped in its first epoch (only step checkpoints), then its
    config changed (a wider hidden layer, as after a code change): --resume rebuilds the
    model from config.json and refuses the checkpoint, naming the first variable that
    differs; exit 2, one line, nothing in the run directory touched."""
    import hashlib

    from train.cli import main

    data = embedded.generate(seed=1, train_size=96, dev_size=16, test_size=16)
    files = []
    for split in ("train", "dev", "test"):
        _write_conllu(tmp_path / f"{split}.conllu", getattr(data, split))
        files += [f"--{split}-file", str(tmp_path / f"{split}.conllu")]
    out = tmp_path / "run"
    argv = _cli(out, files)[3:]
    calls = []
    train_batch = engine.Engine.train_batch

    def signalling(self, batch):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return train_batch(self, batch)

    monkeypatch.setattr(engine.Engine, "train_batch", signalling)
    try:
        assert main(argv) == 130
    finally:
        distribute.reset()
    monkeypatch.setattr(engine.Engine, "train_batch", train_batch)
    assert (
        not (out / "checkpoints" / "last.keras").exists()
        and checkpoint.latest(out / "checkpoints")[0]
    )
    config = read_json(out / "config.json")
    config["model"]["hidden_dim"] = 24
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def snapshot():
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    capsys.readouterr()
    try:
        assert main(argv + ["--resume"]) == 2
    finally:
        distribute.reset()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err  # 'resuming ...' is printed only once the restore succeeded
    assert re.fullmatch(
        r"error: checkpoint \S+step-00000003\.npz does not fit this model: model variable "
        r"'attention_in/kernel' has shape \(24, 16\) there, \(24, 24\) here",
        err[0],
    ), err[0]
    assert snapshot() == before


# ---------------------------------------------------------------------------
# The Keras-format files --resume reads (last.keras, best.weights.h5): checksum
# records, the previous copy kept, fallback or a one-line refusal.


def _damage(path, how):
    data = pathlib.Path(path).read_bytes()
    if how == "truncated":
        pathlib.Path(path).write_bytes(data[: len(data) // 2])
    else:  # one byte changed in the middle: same size, another SHA-256
        middle = len(data) // 2
        pathlib.Path(path).write_bytes(
            data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
        )


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_checked_file_falls_back_to_its_previous_copy(tmp_path, capsys, how):
    path = str(tmp_path / "last.keras")
    for i in (1, 2):
        checkpoint.save_checked(
            path,
            lambda tmp, i=i: pathlib.Path(tmp).write_bytes(bytes([i]) * 1000),
            meta={"epoch": i},
        )
    assert sorted(os.listdir(tmp_path)) == [
        "last.keras",
        "last.keras.sha256",
        "last.prev.keras",
        "last.prev.keras.sha256",
    ]
    assert checkpoint.recover(path) == ({"epoch": 2}, False)
    _damage(path, how)
    capsys.readouterr()
    assert checkpoint.recover(path) == ({"epoch": 1}, True)
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith(path)
        and err[0].endswith("; falling back to last.prev.keras")
    )
    assert pathlib.Path(path).read_bytes() == bytes([1]) * 1000 and os.path.exists(
        path + ".damaged"
    )
    assert checkpoint.recover(path) == ({"epoch": 1}, False)  # the copy in place is good now
    _damage(path, how)
    _damage(str(tmp_path / "last.prev.keras"), how)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="no earlier good copy to fall back to"):
        checkpoint.recover(path)


def test_a_damaged_checksum_record_is_a_damaged_copy(tmp_path):
    path = str(tmp_path / "best.weights.h5")
    for i in (1, 2):
        checkpoint.save_checked(
            path,
            lambda tmp, i=i: pathlib.Path(tmp).write_bytes(bytes([i]) * 10),
            meta={"best_epoch": i},
        )
    assert os.path.exists(tmp_path / "best.prev.weights.h5")
    pathlib.Path(path + ".sha256").write_text('{"sha2')
    assert checkpoint.checked(path)[0] == {"best_epoch": 1}
    assert "checksum record best.weights.h5.sha256 cannot be read" in checkpoint.checked(path)[1]


def _tagger_files(tmp_path):
    data = embedded.generate(seed=1, train_size=240, dev_size=40, test_size=60)
    files = []
    for split in ("train", "dev", "test"):
        _write_conllu(tmp_path / f"{split}.conllu", getattr(data, split))
        files += [f"--{split}-file", str(tmp_path / f"{split}.conllu")]
    return files


def _main(argv):
    from train.cli import main

    try:
        return main(argv)
    finally:
        distribute.reset()


@pytest.fixture(scope="module")
def stopped_in_epoch_3(tmp_path_factory, uninterrupted):
    """A 3-epoch tagger run (30 steps an epoch) uninterrupted (the kill tests' run), and
    the same run stopped by SIGINT in epoch 3 (last.keras of epoch 2, last.prev.keras of
    epoch 1). Returns (folder holding "stopped" and "pristine", the uninterrupted run,
    the data flags)."""
    import shutil

    start, wait = uninterrupted
    files, full = start()
    base = tmp_path_factory.mktemp("checked_files")
    distribute.reset()
    train_batch = engine.Engine.train_batch
    calls = []

    def signalling(self, batch):
        calls.append(1)
        if len(calls) == 65:
            os.kill(os.getpid(), signal.SIGINT)
        return train_batch(self, batch)

    engine.Engine.train_batch = signalling
    try:
        assert _main(_cli(base / "stopped", files)[3:]) == 130
    finally:
        engine.Engine.train_batch = train_batch
    ckpt = base / "stopped" / "checkpoints"
    assert read_json(ckpt / "state.json")["epoch"] == 2
    assert {
        "last.keras",
        "last.keras.sha256",
        "last.prev.keras",
        "last.prev.keras.sha256",
        "best.weights.h5",
        "best.weights.h5.sha256",
    } <= set(os.listdir(ckpt))
    shutil.copytree(base / "stopped", base / "pristine")
    wait()
    return base, full, files


@pytest.mark.slow
def test_resume_past_a_damaged_last_keras_falls_back_to_the_previous_epoch(
    stopped_in_epoch_3, tmp_path, capsys
):
    """last.keras truncated: --resume says so in one line and continues from
    last.prev.keras (the end of epoch 1; the step checkpoints of epochs 2 and 3 are past
    it and left alone, so no epoch end is skipped): epochs 2 and 3 are trained again, to
    the uninterrupted run's step count. (Not to its weights: last.keras does not carry
    the dropout generators' state that step checkpoints carry.)"""
    import shutil

    base, full, files = stopped_in_epoch_3
    out = tmp_path / "run"
    shutil.copytree(base / "pristine", out)
    _damage(out / "checkpoints" / "last.keras", "truncated")
    capsys.readouterr()
    assert _main(_cli(out, files, "--resume")[3:]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "falling back" in line]
    assert len(lines) == 1 and re.fullmatch(
        r"\S+last\.keras is truncated or damaged \(\d+ bytes, \d+ written\); "
        r"falling back to last\.prev\.keras",
        lines[0],
    ), err
    assert "resuming" in err and "at epoch 1 of 3" in err and "restored step-" not in err
    state = read_json(out / "checkpoints" / "state.json")
    want = read_json(full / "checkpoints" / "state.json")
    assert [h["epoch"] for h in state["history"]] == [1, 2, 3]  # none twice, none lost
    assert state["history"][0] == want["history"][0]
    assert read_json(out / "metrics.json")["epochs"] == 3
    steps = keras.models.load_model(out / "checkpoints" / "last.keras").optimizer.iterations
    assert int(steps.numpy()) == 3 * 30


@pytest.mark.slow
@pytest.mark.parametrize("name", ["last", "best"])
def test_resume_refuses_when_no_copy_is_good(stopped_in_epoch_3, tmp_path, capsys, name):
    """Both copies damaged (or the only one): exit 2, one line, nothing touched."""
    import hashlib
    import shutil

    base, full, files = stopped_in_epoch_3
    out = tmp_path / "run"
    shutil.copytree(base / "pristine", out)
    ckpt = out / "checkpoints"
    target = {"last": ["last.keras", "last.prev.keras"], "best": ["best.weights.h5"]}[name]
    for file in target:
        _damage(ckpt / file, "corrupted")
    if name == "best":
        for file in ("best.prev.weights.h5", "best.prev.weights.h5.sha256"):
            if (ckpt / file).exists():
                (ckpt / file).unlink()

    def snapshot():
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    capsys.readouterr()
    assert _main(_cli(out, files, "--resume")[3:]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert re.fullmatch(
        rf"error: \S+{target[0].replace('.', '[.]')} fails its SHA-256 checksum \(damaged\); "
        r"no earlier good copy to fall back to",
        err[0],
    ), err[0]
    assert snapshot() == before


@pytest.mark.slow
def test_every_step_checkpoint_damaged_and_no_epoch_end_state_is_refused(tmp_path, capsys):
    """Nothing good to resume from (a run stopped in its first epoch): refused, not
    silently started again from scratch; with an epoch-end state (initial_epoch > 0) the
    run continues from it, saying so."""
    model = _tiny_classifier()
    engine.fit(
        model, _batches(4), epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=2
    )
    for path in checkpoint.list_checkpoints(tmp_path):
        pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[:100])
    with pytest.raises(checkpoint.DamagedCheckpoint, match="no earlier checkpoint to fall back to"):
        engine.fit(
            _tiny_classifier(), _batches(4), epochs=1, verbose=0, checkpoint_dir=str(tmp_path)
        )
    capsys.readouterr()
    engine.fit(
        _tiny_classifier(),
        _batches(4),
        epochs=2,
        initial_epoch=1,
        verbose=0,
        checkpoint_dir=str(tmp_path),
    )
    assert "falling back to the state at the end of epoch 1" in capsys.readouterr().err


def test_recover_repairs_state_json_and_follows_the_best_weights_copy(tmp_path, capsys):
    """RunCheckpoint's files: state.json damaged is written again from last.keras's
    record; best.weights.h5 damaged falls back to the previous best, and the state's
    best epoch and accuracy follow the weights in place."""
    from train.callbacks import BEST, STATE, RunCheckpoint, read_state, recover

    model = _tiny_classifier()
    model(np.zeros((1, 4), "float32"))
    callback = RunCheckpoint(
        str(tmp_path), {"epoch": 0, "best_val_acc": None, "best_epoch": None, "train_seconds": 0.0}
    )
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {"val_acc": 0.5, "loss": 1.0})
    callback.on_epoch_end(1, {"val_acc": 0.9, "loss": 0.5})
    want = read_state(str(tmp_path))
    assert (want["epoch"], want["best_epoch"], want["best_val_acc"]) == (2, 2, 0.9)
    (tmp_path / STATE).write_text('{"epoch": 2, "hist')
    recover(str(tmp_path))
    assert read_state(str(tmp_path)) == want and capsys.readouterr().err == ""
    _damage(tmp_path / BEST, "corrupted")
    recover(str(tmp_path))
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("fails its SHA-256 checksum (damaged); falling back to best.prev.weights.h5")
    )
    state = read_state(str(tmp_path))
    assert (state["epoch"], state["best_epoch"], state["best_val_acc"]) == (2, 1, 0.5)
    model.load_weights(tmp_path / BEST)  # the copy in place loads
