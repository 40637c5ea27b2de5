"""Nothing lost: step and best checkpoints, SIGKILL then --resume, NaN stops cleanly,
mixed precision."""

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

import zoo
import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support import clock, paths, tiny
from tests.support.runs import training_env
from train import checkpoint, engine
from train.model_step import TfModelStep
from train.strategy import RunContext
from train.tagger import embedded
from zoo.rundir import load_json as read_json

ROOT = pathlib.Path(paths.ROOT)
TINY = tiny.TAGGER_MINI_MODEL


def _tiny_classifier():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def _fit(model, batches, epochs=1, checkpoint_dir=None, every=0, **plan):
    """engine.fit of a compiled model; returns the run's state."""
    plan = engine.Plan(
        epochs=epochs,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        checkpoint_every=every,
        verbose=0,
        **plan,
    )
    return engine.fit(TfModelStep(model), batches, plan)


def test_a_run_the_clock_stops_ends_its_learning_rate_decay(monkeypatch):
    # 1000 epochs of 30-ms steps do not fit in 3 s: the clock stops the run after 100
    # steps, and the cosine the step sets into the optimizer has followed the clock (not
    # the 1000 epochs' steps) down from its peak to near zero by the last step.
    peak, rates = 1e-2, []
    rate = engine.warmup_cosine(peak, 2, 1000)
    clock.fixed_step_clock(monkeypatch, 0.03)

    class Recorded(TfModelStep):
        def train(self, batch, at=None):
            rates.append(rate(at))
            return super().train(batch, at)

    model = _tiny_classifier()
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    plan = engine.Plan(epochs=1000, max_minutes=0.05, verbose=0)
    state = engine.fit(Recorded(model, rate=rate), [(x, np.arange(8) % 3)], plan)
    assert state["stopped_by_time_limit"] and 90 < state["step"] < 110, state["step"]
    assert rates[2] > 0.5 * peak and rates[-1] < 0.01 * peak, rates
    assert all(a >= b for a, b in zip(rates[2:], rates[3:]))  # it only decays
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(rates[-1])


def _state(directory):
    """The run's state as its newest step checkpoint records it."""
    return checkpoint.latest(directory)[1]["state"]


def _save(directory, model, step=1):
    return checkpoint.save(
        str(directory),
        {"model": model.variables, "optimizer": model.optimizer.variables},
        {"step": step},
        refs={"optimizer": model.trainable_variables},
        models=(model,),
    )


def _restore(path, model):
    return checkpoint.restore(
        path,
        {"model": model.variables, "optimizer": model.optimizer.variables},
        refs={"optimizer": model.trainable_variables},
        models=(model,),
    )


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
        _fit(model, _batches(8, nan_at=4), epochs=2, checkpoint_dir=ckpt, every=2)
    message = str(info.value)
    assert "loss became nan" in message and "step 5" in message and "step-00000004.npz" in message
    assert [os.path.basename(p) for p in checkpoint.list_checkpoints(ckpt)] == [
        "step-00000002.npz",
        "step-00000004.npz",
    ]
    # The weights in memory are ruined; the checkpoint holds the last finite ones.
    assert not all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)
    fresh = _tiny_classifier()
    TfModelStep(fresh).build(_batches(1)[0])
    record = _restore(checkpoint.path_for(ckpt, 4), fresh)
    assert record == {**record, "step": 4, "epoch": 0, "batches_done": 4}
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
    _fit(model, [(x, y, w)])
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
    _fit(model, _batches(4), checkpoint_dir=tmp_path, every=2)
    paths = checkpoint.list_checkpoints(tmp_path)
    assert [os.path.basename(p) for p in paths] == ["step-00000002.npz", "step-00000004.npz"]
    pathlib.Path(paths[-1]).write_bytes(pathlib.Path(paths[-1]).read_bytes()[:100])
    path, record, _ = checkpoint.latest(tmp_path)
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
            record = checkpoint.latest(ckpt)[1] if ckpt.exists() else None
            if record and record["epoch"] == kill_epoch and record["batches_done"]:
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
        assert f"resuming {tmp_path / 'killed'} at epoch {kill_epoch + 1}, batch " in err, err
        wait()
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    state = _state(tmp_path / "killed" / "checkpoints")
    want = _state(full / "checkpoints")
    assert [h["epoch"] for h in state["history"]] == [1, 2, 3]  # none redone, none lost
    assert state["step"] == want["step"] == 3 * 30
    # The step checkpoints carry the dropout generators' state: the resumed run ends
    # with the uninterrupted run's weights, and so its metrics.
    a = read_json(full / "metrics.json")
    b = read_json(tmp_path / "killed" / "metrics.json")
    for key in ("test_accuracy", "dev_accuracy", "test_unseen_accuracy", "best_epoch"):
        assert a[key] == b[key], (key, a[key], b[key])


@pytest.mark.slow
def test_mixed_precision_runs_train_without_nans_and_save_float32_models(tmp_path):
    from train.cli import main
    from train.tagger import TaggerConfig
    from train.tagger.training import train_one

    keras.config.set_dtype_policy("mixed_bfloat16")
    data = embedded.generate(seed=0, train_size=64, dev_size=16, test_size=16)
    args = TaggerConfig(
        epochs=1,
        batch_size=16,
        max_minutes=0.0,
        verbose="0",
        model_option=[f"{k}={json.dumps(v)}" for k, v in TINY.items()],
    )
    train_one(RunContext(), args, data, "attention", str(tmp_path / "tagger"))
    history = _state(tmp_path / "tagger" / "checkpoints")["history"]
    assert np.isfinite(history[0]["loss"]) and np.isfinite(history[0]["val_loss"])
    keras.config.set_dtype_policy("float32")
    _assert_float32(keras.models.load_model(tmp_path / "tagger" / "model.keras"))
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
    # It trained in mixed precision and took its dtype policy back on exit.
    assert keras.config.dtype_policy().name == "float32"
    with open(out / "config.json") as f:
        assert json.load(f)["runtime"]["dtype_policy"] == "mixed_bfloat16"
    history = _state(out / "checkpoints")["history"]
    assert np.isfinite(history[0]["loss"]) and np.isfinite(history[0]["val_loss"])
    model = keras.models.load_model(out / "model.keras")
    _assert_float32(model)
    # What the SavedModel export traces first (it failed on a mixed model.keras: a
    # bfloat16 model whose layers took the loader's float32 policy).
    encoded, _ = model.encode(np.array([[5, 6, 7]], "int32"))
    assert encoded.dtype == "float32"


def _mixed_models():
    """(model, inputs) of each model kind, built under the mixed_bfloat16 policy."""
    from tests.support.runs import SENTENCES, make_tagger
    from zoo.sagan.model import build_discriminator, build_generator
    from zoo.tagger.model import pad_tokens

    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        tagger = make_tagger()
        seq2seq = zoo.build(
            "universal_transformer",
            vocabulary_size=20,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
            num_steps=2,
            act=True,
        )
        sagan = dict(image_size=32, channels=3, num_classes=4, width=8)
        generator = build_generator(latent_dim=16, **sagan)
        discriminator = build_discriminator(**sagan)
    finally:
        keras.config.set_dtype_policy("float32")
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 20, (2, 5)).astype("int32")
    labels = np.array([0, 3], "int32")
    return [
        (tagger, tagger.encode_tf(pad_tokens(SENTENCES))),
        (seq2seq, {"source_ids": ids, "target_ids": ids}),
        (generator, {"noise": rng.standard_normal((2, 16)).astype("float32"), "label": labels}),
        (discriminator, {"image": rng.uniform(-1, 1, (2, 32, 32, 3)), "label": labels}),
    ]


def test_float32_model_copies_a_mixed_model_into_float32_with_its_weights():
    """train.steps.float32_model, what a mixed-precision run evaluates and saves: every
    layer float32, the same weights, and the mixed model's outputs to bfloat16's
    precision (a float32 model comes back as it is)."""
    from train.steps import float32_model

    for model, inputs in _mixed_models():
        copy = float32_model(model)
        _assert_float32(copy)
        for a, b in zip(model.get_weights(), copy.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        want = np.asarray(model(inputs, training=False), "float32")
        got = np.asarray(copy(inputs, training=False))
        assert got.dtype == np.float32 and want.shape == got.shape
        np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max() + 1e-3)
        assert float32_model(copy) is copy


def _assert_float32(model):
    """A run's model.keras computes in float32 whatever precision trained it."""
    layers = [model, *model._flatten_layers()]
    assert {layer.dtype_policy.name for layer in layers} == {"float32"}, [
        (layer.name, layer.dtype_policy.name) for layer in layers
    ]


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
    path = _save(tmp_path, a)
    b = _two_layer(("second", "first"))  # same layers, created in the other order
    assert "second/" in b.trainable_variables[0].path and "first/" in a.trainable_variables[0].path
    _restore(path, b)
    for name in ("first", "second"):
        for x, y in zip(getattr(a, name).weights, getattr(b, name).weights):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    x = np.random.default_rng(1).normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(a(x)), np.asarray(b(x)), atol=1e-6)


def test_a_renamed_variable_is_refused_naming_it_and_nothing_is_assigned(tmp_path):
    a = _two_layer()
    path = _save(tmp_path, a)
    b = _two_layer(names={"second": "third"})
    before = [v.numpy().copy() for v in b.variables]
    with pytest.raises(
        checkpoint.UsageError,
        match=r"model variable '[a-z_0-9]*/?third/kernel' is not in the checkpoint",
    ):
        _restore(path, b)
    assert all(np.array_equal(x, v.numpy()) for x, v in zip(before, b.variables))


def test_a_changed_shape_is_refused_naming_the_variable(tmp_path):
    a = _tiny_classifier()
    TfModelStep(a).build(_batches(1)[0])
    path = _save(tmp_path, a)
    b = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    b.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    b.optimizer.build(b.trainable_variables)
    with pytest.raises(
        checkpoint.UsageError,
        match=r"'[a-z_0-9/]*dense(_\d+)?/kernel' has shape \(4, 3\) there, \(5, 3\) here",
    ):
        _restore(path, b)


def test_another_model_configuration_is_refused(tmp_path):
    a = _two_layer(activation="relu")
    path = _save(tmp_path, a)
    b = _two_layer(activation="tanh")  # same variables, another function
    with pytest.raises(checkpoint.UsageError, match="another model configuration"):
        _restore(path, b)
    c = _two_layer(activation="relu")  # control: the same configuration restores
    _restore(path, c)


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path):
    """A file of an earlier format (here the first one, keyed by position) is refused
    with one line saying so, not read by guesswork."""
    a = _two_layer()
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(a.variables)}
    arrays["record"] = np.frombuffer(json.dumps({"step": 1}).encode("utf-8"), dtype=np.uint8)
    path = str(tmp_path / "step-00000001.npz")
    np.savez(path, **arrays)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="not of this version's format"):
        _restore(path, _two_layer())
    assert checkpoint.latest(tmp_path)[0] is None


def test_a_checkpoint_recording_another_format_number_is_refused(tmp_path):
    """The members of this format, checksummed, but a manifest of another format number
    (as a later change of the layout inside would write): refused in one line."""
    a = _two_layer()
    path = _save(tmp_path, a)
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    manifest = json.loads(bytes(arrays[checkpoint.MANIFEST]).decode("utf-8"))
    assert manifest["format"] == checkpoint.FORMAT
    manifest["format"] = checkpoint.FORMAT + 1
    arrays[checkpoint.MANIFEST] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    del arrays[checkpoint.CHECKSUM]
    digest = checkpoint._digest(arrays)  # re-checksummed: only the format number differs
    arrays[checkpoint.CHECKSUM] = np.frombuffer(digest.encode("ascii"), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="not of this version's format"):
        _restore(path, _two_layer())


def test_a_member_changed_behind_the_zip_crc_fails_the_checksum(tmp_path):
    """Re-zipped with one changed value (valid CRCs): only the SHA-256 can tell."""
    import zipfile

    a = _two_layer()
    path = _save(tmp_path, a)
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    key = next(k for k in arrays if k.endswith("first/kernel"))
    arrays[key] = arrays[key] + 1.0
    np.savez(path, **arrays)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    with pytest.raises(checkpoint.DamagedCheckpoint, match="SHA-256"):
        _restore(path, a)


def test_resume_falls_back_past_a_damaged_checkpoint_and_says_so(tmp_path, capsys):
    model = _tiny_classifier()
    _fit(model, _batches(6), checkpoint_dir=tmp_path, every=2)
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
    _fit(resumed, _batches(6), checkpoint_dir=tmp_path, every=2)
    err = capsys.readouterr().err
    assert "step-00000006.npz" in err and "falling back to step-00000004.npz" in err
    assert "at epoch 1, batch 4 of 1 from step-00000004.npz" in err
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
    train = TfModelStep.train

    def signalling(self, batch, at):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return train(self, batch, at)

    monkeypatch.setattr(TfModelStep, "train", signalling)
    assert main(argv) == 130
    monkeypatch.setattr(TfModelStep, "train", train)
    assert checkpoint.latest(out / "checkpoints")[1]["state"]["epoch"] == 0
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
    assert main(argv + ["--resume"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err  # 'resuming ...' is printed only once the restore succeeded
    assert re.fullmatch(
        r"error: checkpoint \S+step-00000003\.npz does not fit this model: model variable "
        r"'attention_in/kernel' has shape \(24, 16\) there, \(24, 24\) here",
        err[0],
    ), err[0]
    assert snapshot() == before


# ---------------------------------------------------------------------------
# The best checkpoint (the weights a run keeps) and damaged checkpoints on --resume:
# the previous copy, said in one line, or a one-line refusal.


def _damage(path, how):
    """Truncated, or one byte of the largest member's values changed (same size)."""
    import zipfile

    data = pathlib.Path(path).read_bytes()
    if how == "truncated":
        pathlib.Path(path).write_bytes(data[: len(data) // 2])
        return
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    header = (
        30
        + len(info.filename.encode())
        + int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    )
    at = info.header_offset + header + info.file_size - 1  # the last value byte
    pathlib.Path(path).write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])


def _scored_fit(model, ckpt, scores, kept):
    """len(scores) epochs; epoch e's logs get score scores[e]; `kept[e]`: its weights."""

    def score(epoch, logs):
        logs["score"] = scores[epoch]
        kept[epoch + 1] = [v.numpy().copy() for v in model.trainable_variables]

    return _fit(
        model,
        _batches(4),
        epochs=len(scores),
        checkpoint_dir=ckpt,
        best=engine.highest("score"),
        hooks=(score,),
    )


def test_the_best_epoch_is_kept_with_its_predecessor_and_restored_at_the_end(tmp_path):
    model, kept = _tiny_classifier(), {}
    state = _scored_fit(model, tmp_path, [0.5, 0.9, 0.7], kept)
    assert state["best"]["epoch"] == 2 and state["best"]["logs"]["score"] == 0.9
    assert [os.path.basename(p) for p in checkpoint.list_checkpoints(tmp_path, "best")] == [
        "best-00000004.npz",
        "best-00000008.npz",
    ]
    for got, want in zip(model.trainable_variables, kept[2]):  # not epoch 3's, the last
        np.testing.assert_array_equal(got.numpy(), want)
    assert not all(np.array_equal(a, b) for a, b in zip(kept[2], kept[3]))


def _averaged_fit(tmp_path, keys, average_last, epochs=None):
    """Training to `epochs` (default len(keys) - 1) whose epochs this call trains get the
    `Plan.best` keys keys[:-1] in turn; the last key is the average's. Returns (model,
    state, the weights of each epoch end this call trained)."""
    model, kept, order = _tiny_classifier(), {}, iter(keys)

    def record(epoch, logs):
        kept[epoch + 1] = [v.numpy().copy() for v in model.trainable_variables]

    state = _fit(
        model,
        _batches(4),
        epochs=epochs or len(keys) - 1,
        checkpoint_dir=tmp_path,
        validation=_batches(2, seed=1),
        best=lambda logs: [next(order)],
        hooks=(record,),
        average_last=average_last,
    )
    return model, state, kept


def test_the_mean_of_the_last_epochs_is_kept_where_it_ranks_at_least_as_the_best(tmp_path):
    # Four epochs, the second the best (0.3); the mean of epochs 2-4 ranks 0.2: kept.
    model, state, kept = _averaged_fit(tmp_path, [0.5, 0.3, 0.4, 0.6, 0.2], 3)
    assert state["best"]["epoch"] == 2
    assert state["averaged"]["epochs"] == [2, 3, 4] and state["averaged"]["kept"]
    assert "val_acc" in state["averaged"]["logs"]
    assert len(checkpoint.list_checkpoints(tmp_path, "epoch")) == 3
    for i, got in enumerate(model.trainable_variables):
        want = np.mean([kept[e][i] for e in (2, 3, 4)], axis=0)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


def test_a_mean_that_ranks_below_the_best_epoch_gives_the_best_epoch_back(tmp_path):
    model, state, kept = _averaged_fit(tmp_path, [0.5, 0.3, 0.4, 0.6, 0.35], 3)
    assert state["averaged"]["epochs"] == [2, 3, 4] and not state["averaged"]["kept"]
    for got, want in zip(model.trainable_variables, kept[2]):
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_mean_that_cannot_be_ranked_gives_the_best_epoch_back(tmp_path):
    # The epochs are ranked by a hook's log (no validation), which the mean has not: the
    # mean is not kept, the best epoch's weights are.
    model, kept = _tiny_classifier(), {}

    def score(epoch, logs):
        logs["score"] = [0.5, 0.9, 0.7][epoch]
        kept[epoch + 1] = [v.numpy().copy() for v in model.trainable_variables]

    state = _fit(
        model,
        _batches(4),
        epochs=3,
        checkpoint_dir=tmp_path,
        best=engine.highest("score"),
        hooks=(score,),
        average_last=3,
    )
    assert state["averaged"]["epochs"] == [1, 2, 3] and not state["averaged"]["kept"]
    for got, want in zip(model.trainable_variables, kept[2]):
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_damaged_epoch_is_left_out_of_the_mean_saying_so(tmp_path, capsys):
    _averaged_fit(tmp_path, [0.5, 0.3, 0.4, 0.2], 3)
    _damage(checkpoint.list_checkpoints(tmp_path, "epoch")[-1], "corrupted")  # epoch 3's
    # Resumed for epochs 4 and 5: the mean of the last three leaves epoch 3 out.
    model, state, kept = _averaged_fit(tmp_path, [0.7, 0.8, 0.1], 3, epochs=5)
    assert state["averaged"]["epochs"] == [4, 5] and state["averaged"]["kept"]
    assert "the average leaves it out" in capsys.readouterr().err
    for i, got in enumerate(model.trainable_variables):
        want = np.mean([kept[e][i] for e in (4, 5)], axis=0)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_a_damaged_best_falls_back_to_the_previous_one_and_the_state_follows(tmp_path, capsys, how):
    model, kept = _tiny_classifier(), {}
    _scored_fit(model, tmp_path, [0.5, 0.9, 0.7], kept)
    _damage(tmp_path / "best-00000008.npz", how)
    capsys.readouterr()
    # Resumed for a fourth epoch scoring 0.6: better than epoch 1's 0.5, the best left.
    state = _scored_fit(_tiny_classifier(), tmp_path, [0.5, 0.9, 0.7, 0.6], {})
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "falling back" in line] == [
        next(line for line in err if "best-00000008.npz" in line)
    ]
    assert err[0].endswith("; falling back to best-00000004.npz"), err
    assert state["best"]["epoch"] == 4 and state["best"]["logs"]["score"] == 0.6


def test_no_good_best_is_refused(tmp_path):
    _scored_fit(_tiny_classifier(), tmp_path, [0.5, 0.9], {})
    for path in checkpoint.list_checkpoints(tmp_path, "best"):
        _damage(path, "corrupted")
    with pytest.raises(checkpoint.DamagedCheckpoint, match="no earlier good copy to fall back"):
        _scored_fit(_tiny_classifier(), tmp_path, [0.5, 0.9, 0.7], {})


def test_every_step_checkpoint_damaged_is_refused(tmp_path):
    """Nothing good to resume from: refused, not silently started again from scratch."""
    _fit(_tiny_classifier(), _batches(4), checkpoint_dir=tmp_path, every=2)
    for path in checkpoint.list_checkpoints(tmp_path):
        pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[:100])
    with pytest.raises(checkpoint.DamagedCheckpoint, match="no earlier checkpoint to fall back to"):
        _fit(_tiny_classifier(), _batches(4), checkpoint_dir=tmp_path)


def _tagger_files(tmp_path):
    data = embedded.generate(seed=1, train_size=240, dev_size=40, test_size=60)
    files = []
    for split in ("train", "dev", "test"):
        _write_conllu(tmp_path / f"{split}.conllu", getattr(data, split))
        files += [f"--{split}-file", str(tmp_path / f"{split}.conllu")]
    return files


def _main(argv):
    from train.cli import main

    return main(argv)


@pytest.fixture(scope="module")
def stopped_in_epoch_3(tmp_path_factory, uninterrupted):
    """A 3-epoch tagger run (30 steps an epoch) uninterrupted (the kill tests' run), and
    the same run stopped by SIGINT at step 65 (epoch 3). Returns (folder holding
    "stopped" and "pristine", the uninterrupted run, the data flags)."""
    import shutil

    start, wait = uninterrupted
    files, full = start()
    base = tmp_path_factory.mktemp("damaged")
    train = TfModelStep.train
    calls = []

    def signalling(self, batch, at):
        calls.append(1)
        if len(calls) == 65:
            os.kill(os.getpid(), signal.SIGINT)
        return train(self, batch, at)

    TfModelStep.train = signalling
    try:
        assert _main(_cli(base / "stopped", files)[3:]) == 130
    finally:
        TfModelStep.train = train
    ckpt = base / "stopped" / "checkpoints"
    assert _state(ckpt)["epoch"] == 2
    names = [os.path.basename(p) for p in checkpoint.list_checkpoints(ckpt)]
    assert names == ["step-00000062.npz", "step-00000064.npz", "step-00000065.npz"]
    assert checkpoint.list_checkpoints(ckpt, "best")
    shutil.copytree(base / "stopped", base / "pristine")
    wait()
    return base, full, files


@pytest.mark.slow
def test_resume_past_a_damaged_newest_checkpoint_ends_where_the_uninterrupted_run_ends(
    stopped_in_epoch_3, tmp_path, capsys
):
    """The newest step checkpoint truncated: --resume says so in one line, continues
    from the one before (step 64) and ends with the uninterrupted run's state, best
    epoch and metrics."""
    import shutil

    base, full, files = stopped_in_epoch_3
    out = tmp_path / "run"
    shutil.copytree(base / "pristine", out)
    _damage(out / "checkpoints" / "step-00000065.npz", "truncated")
    capsys.readouterr()
    assert _main(_cli(out, files, "--resume")[3:]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "falling back" in line]
    assert len(lines) == 1 and re.fullmatch(
        r"checkpoint \S+step-00000065\.npz cannot be read \(.*\); "
        r"falling back to step-00000064\.npz",
        lines[0],
    ), err
    assert f"resuming {out} at epoch 3, batch 4 of 3 from step-00000064.npz" in err
    state, want = _state(out / "checkpoints"), _state(full / "checkpoints")
    assert [h["epoch"] for h in state["history"]] == [1, 2, 3]  # none twice, none lost
    assert state["step"] == want["step"] == 3 * 30
    assert state["best"]["epoch"] == want["best"]["epoch"]
    a, b = read_json(full / "metrics.json"), read_json(out / "metrics.json")
    for key in ("test_accuracy", "dev_accuracy", "epochs", "best_epoch"):
        assert a[key] == b[key], (key, a[key], b[key])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["step", "best"])
def test_resume_refuses_when_no_copy_is_good(stopped_in_epoch_3, tmp_path, capsys, name):
    """Every copy damaged: exit 2, one line, nothing touched."""
    import hashlib
    import shutil

    base, full, files = stopped_in_epoch_3
    out = tmp_path / "run"
    shutil.copytree(base / "pristine", out)
    for path in checkpoint.list_checkpoints(out / "checkpoints", name):
        _damage(path, "corrupted")

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
    want = {"step": "no earlier checkpoint", "best": "no earlier good copy"}[name]
    assert re.fullmatch(
        rf"error: checkpoint \S+{name}-\d+\.npz (fails its SHA-256 checksum \(damaged\)|"
        rf"cannot be read \(.*\)); {want} to fall back to",
        err[0],
    ), err[0]
    assert snapshot() == before
