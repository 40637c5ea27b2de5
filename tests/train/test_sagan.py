"""SAGAN: builders, FID/KID, a tiny training run (finite losses, FID falls, resume),
generator export (SavedModel uint8, TFLite fp32/fp16 batch 1 passing the GPU check,
LiteRT == Keras), zoo.generate, and CLI bad inputs (one line, exit 2, nothing lost)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support import tiny
from tests.support.paths import ROOT
from train import checkpoint
from train.sagan.fid import frechet_distance, kernel_inception_distance
from zoo import atomic

ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


# ---------------------------------------------------------------- builders
@pytest.mark.slow
@pytest.mark.parametrize("num_classes", [None, 3])
def test_builders_shapes_and_attention_placement(num_classes):
    g = zoo.build("sagan_generator", image_size=64, num_classes=num_classes, width=4, latent_dim=8)
    d = zoo.build("sagan_discriminator", image_size=64, num_classes=num_classes, width=4)
    feed = {"noise": np.zeros((2, 8), "float32")}
    if num_classes:
        feed["label"] = np.array([0, 2], "int32")
    image = np.asarray(g.predict_on_batch(feed))
    assert image.shape == (2, 64, 64, 3) and np.all(np.abs(image) <= 1)
    dfeed = {"image": image, **({"label": feed["label"]} if num_classes else {})}
    assert np.asarray(d.predict_on_batch(dfeed)).shape == (2, 1)
    # Default: the second-largest feature map (32 for 64x64 images), in G and D.
    assert g.get_layer("self_attention").input.shape[1] == 32
    assert d.get_layer("self_attention").input.shape[1] == 32
    g16 = zoo.build(
        "sagan_generator", image_size=64, width=4, latent_dim=8, attention_resolution=16
    )
    assert g16.get_layer("self_attention").input.shape[1] == 16
    none = zoo.build(
        "sagan_generator", image_size=32, width=4, latent_dim=8, attention_resolution=None
    )
    assert not any(layer.name == "self_attention" for layer in none.layers)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"image_size": 48}, "image_size=48"),
        ({"image_size": 16}, "image_size=16"),
        ({"attention_resolution": 32}, "attention_resolution=32"),
        ({"num_classes": 1}, "num_classes=1"),
    ],
)
def test_builder_bad_arguments(kwargs, message):
    for name in ("sagan_generator", "sagan_discriminator"):
        with pytest.raises(ValueError, match=message):
            zoo.build(name, **kwargs)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_generator_bad_class_embedding(value):
    with pytest.raises(ValueError, match=f"class_embedding={value!r}"):
        zoo.build("sagan_generator", num_classes=3, class_embedding=value)


def test_class_embedding_is_concatenated_to_the_noise():
    """With a class embedding, the label changes the first feature map (the old
    generator's label acted only through CBN gains that start equal for all classes)."""
    g = zoo.build("sagan_generator", num_classes=4, width=4, latent_dim=8, class_embedding=6)
    table = np.asarray(g.get_layer("class_embedding").table)
    labels = np.array([2, 0, 3], "int32")
    noise = np.random.default_rng(0).normal(size=(3, 8)).astype("float32")
    import keras

    joined = keras.Model(g.inputs, g.get_layer("noise_and_class").output)
    got = np.asarray(joined({"noise": noise, "label": labels}))
    np.testing.assert_allclose(got, np.concatenate([noise, table[labels]], axis=1), atol=1e-6)


def test_mode_seeking_loss_is_the_pairwise_formula():
    import tensorflow as tf

    from train.sagan import losses

    rng = np.random.default_rng(3)
    fake = rng.uniform(-1, 1, size=(7, 4, 4, 3)).astype("float32")  # odd: row 6 is unpaired
    noise = rng.normal(size=(7, 8)).astype("float32")
    want = (
        sum(
            1.0
            / (
                np.mean(np.abs(fake[i] - fake[i + 1])) / np.mean(np.abs(noise[i] - noise[i + 1]))
                + 1e-5
            )
            for i in (0, 2, 4)
        )
        / 3.5
    )
    got = losses.mode_seeking(tf.constant(fake), tf.constant(noise), tf.constant(7.0))
    assert abs(float(got) - want) < 1e-4 * want


def _r1_trainer(r1, **kwargs):
    from tests.support import sagan_steps
    from train.sagan.fit import TfSaganStep

    g, d, _ = sagan_steps.build()
    recipe = sagan_steps.recipe(r1=r1, class_loss=0.0, mode_seeking=0.0, **kwargs)
    trainer = TfSaganStep((g, d, None), recipe)
    return trainer, g, d


def test_r1_penalty_falls_on_every_fourth_d_step_only():
    trainer, _, _ = _r1_trainer(1.0, n_dis=100)  # D steps only
    calls = []
    trainer.d_step = lambda *args: calls.append("plain") or (0.0, 0.0, 0.0)
    trainer.d_step_r1 = lambda *args: calls.append("r1") or (0.0, 0.0, 0.0)
    from train.engine import At

    real = np.zeros((2, 32, 32, 3), np.float32)
    for step in range(8):
        trainer.train((real, np.zeros(2, np.int32)), At(step, 0.0))
    assert calls == ["plain", "plain", "plain", "r1"] * 2
    off, _, _ = _r1_trainer(0.0)
    assert not any(off.r1_due(step) for step in range(12))


def test_r1_step_gradient_is_the_hinge_plus_penalty_gradient(monkeypatch):
    """The R1 D step's gradient against a reference written here: nested tapes on the
    real images alone, mean hinge terms, gamma/2 * E|grad_x D|^2 times the lazy interval."""
    import tensorflow as tf

    import train.sagan.fit as sagan_fit
    from tests.support import sagan_steps
    from train.sagan.losses import R1_EVERY

    gamma, rows = 10.0, 4
    trainer, g, d = _r1_trainer(gamma)
    captured = []
    monkeypatch.setattr(
        sagan_fit,
        "apply_global",
        lambda optimizer, grads, variables, replicas: captured.append(
            [np.asarray(x) for x in grads]
        ),
    )
    rng = np.random.default_rng(5)
    real = tf.constant(rng.uniform(-1, 1, (rows, 32, 32, 3)).astype("float32"))
    labels = tf.constant(rng.integers(0, 3, rows).astype("int32"))
    noise = tf.constant(rng.normal(size=(rows, 4)).astype("float32"))
    fake_labels = tf.constant(rng.integers(0, 3, rows).astype("int32"))
    both = sagan_steps.variables(g, d)
    start = [v.numpy() for v in both]
    trainer._d_replica(real, labels, noise, fake_labels, tf.constant(float(rows)), r1=True)

    def reference(weight):
        for v, value in zip(both, start):  # spectral-norm vectors as the step found them
            v.assign(value)
        fake = g({"noise": noise, "label": fake_labels}, training=True)
        with tf.GradientTape() as tape:
            with tf.GradientTape() as inner:
                inner.watch(real)
                logits = d(
                    {
                        "image": tf.concat([real, fake], 0),
                        "label": tf.concat([labels, fake_labels], 0),
                    },
                    training=True,
                )
                real_logits = logits[:rows]
                real_sum = tf.reduce_sum(real_logits)
            grad_x = inner.gradient(real_sum, real)
            penalty = tf.reduce_mean(tf.reduce_sum(tf.square(grad_x), axis=[1, 2, 3]))
            loss = (
                tf.reduce_mean(tf.nn.relu(1.0 - real_logits))
                + tf.reduce_mean(tf.nn.relu(1.0 + logits[rows:]))
                + R1_EVERY * weight / 2.0 * penalty
            )
        return [np.asarray(x) for x in tape.gradient(loss, d.trainable_variables)]

    want, plain = reference(gamma), reference(0.0)
    (got,) = captured
    scale = max(float(np.max(np.abs(w))) for w in want)
    for got_v, want_v in zip(got, want):
        np.testing.assert_allclose(got_v, want_v, rtol=1e-4, atol=1e-5 * scale)
    # The penalty moves this gradient by far more than the tolerance above, so a step
    # without it would fail there.
    assert max(float(np.max(np.abs(w - p))) for w, p in zip(want, plain)) > 1e-2 * scale


@pytest.mark.slow
def test_r1_steps_under_jax_equal_tensorflow(tmp_path):
    """Four training steps (the fourth D step with R1) from the same weights: the JAX
    trainer's jitted steps end where TensorFlow's do."""
    from tests.support import sagan_steps
    from tests.support.backends import run_under_jax

    g, d, _ = sagan_steps.build()
    start = [np.asarray(v.numpy()) for v in sagan_steps.variables(g, d)]
    np.savez(tmp_path / "start.npz", *start)
    want = sagan_steps.run(start)
    run_under_jax(
        "tests.support.sagan_steps", str(tmp_path / "start.npz"), str(tmp_path / "jax.npz")
    )
    with np.load(tmp_path / "jax.npz") as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert len(got) == len(want)
    paths = [v.path for v in sagan_steps.variables(g, d)]
    for path, got_v, want_v in zip(paths, got, want):
        np.testing.assert_allclose(got_v, want_v, atol=1e-5, err_msg=path)
    # Without the R1 step TensorFlow ends far outside that tolerance.
    plain = sagan_steps.run(start, r1=0.0)
    assert max(float(np.max(np.abs(w - p))) for w, p in zip(want, plain)) > 1e-3


# ---------------------------------------------------------------- FID / KID
@pytest.mark.parametrize("jit_compile", [False, True])
def test_upsampling_gradient_is_the_2x2_block_sum(jit_compile):
    """G's upsampling: nearest-neighbour forward, and a gradient that compiles under XLA
    (TensorFlow's own, ResizeNearestNeighborGrad, does not)."""
    import tensorflow as tf

    from zoo.sagan.model import upsample_nearest_2x

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    weights = rng.standard_normal((2, 6, 8, 5)).astype("float32")

    @tf.function(jit_compile=jit_compile)
    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = upsample_nearest_2x(x)
            loss = tf.reduce_sum(y * weights)
        return y, tape.gradient(loss, x)

    y, grad = forward_backward(tf.constant(x))
    np.testing.assert_array_equal(y.numpy(), x.repeat(2, axis=1).repeat(2, axis=2))
    np.testing.assert_allclose(
        grad.numpy(), weights.reshape(2, 3, 2, 4, 2, 5).sum(axis=(2, 4)), rtol=1e-6, atol=1e-6
    )


def test_fid_against_itself_is_zero_and_against_noise_large():
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(16, 16)) / 4
    x = rng.normal(size=(500, 16)) @ mixing
    same_distribution = rng.normal(size=(500, 16)) @ mixing
    noise = rng.uniform(-3, 3, size=(500, 16))
    assert frechet_distance(x, x) < 1e-6
    assert frechet_distance(x, noise) > 10.0
    assert frechet_distance(x, noise) > 50 * frechet_distance(x, same_distribution)
    # KID is unbiased: ~0 for two samples of one distribution, large against noise.
    kid_same = kernel_inception_distance(x, same_distribution)
    kid_noise = kernel_inception_distance(x, noise)
    assert kid_noise > 0.1 and abs(kid_same) < 0.02 * kid_noise


def test_fid_matches_closed_form_in_two_dimensions():
    """tr sqrt(A B) = sqrt(tr(AB) + 2 sqrt(det A det B)) for 2x2 PSD A, B."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(400, 2)) @ np.array([[2.0, 0.5], [0.0, 1.0]]) + [1.0, -2.0]
    b = rng.normal(size=(300, 2)) @ np.array([[0.5, -0.3], [0.2, 1.5]])
    ma, mb = a.mean(0), b.mean(0)
    sa, sb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    tr_sqrt = np.sqrt(np.trace(sa @ sb) + 2 * np.sqrt(np.linalg.det(sa) * np.linalg.det(sb)))
    want = np.sum((ma - mb) ** 2) + np.trace(sa) + np.trace(sb) - 2 * tr_sqrt
    assert abs(frechet_distance(a, b) - want) < 1e-8


# ---------------------------------------------------------------- tiny run
TINY = [
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--train-size",
    "256",
    "--test-size",
    "128",
    "--eval-samples",
    "128",
    "--epoch-eval-samples",
    "128",
    "--classifier-epochs",
    "2",
    "--width",
    "8",
    "--latent-dim",
    "16",
    "--seed",
    "1",
    "--lr-decay-from",
    "0.5",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from train.cli import main
    from train.sagan import training

    out = str(tmp_path_factory.mktemp("sagan") / "run")
    # A run that must end within 11 minutes: the default budget is 11 minus what the data
    # and the classifier took, not 12 (test_default_budget_counts_the_whole_run).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "RUN_MINUTES", 11.0)
        start = time.monotonic()
        assert main(["sagan", "--out", out, *TINY]) == 0
        _TINY_RUN_MINUTES[out] = (time.monotonic() - start) / 60
    return out


_TINY_RUN_MINUTES = {}  # tiny_run's wall time, minutes


def _state(run_dir):
    """The run's state as its newest step checkpoint records it."""
    return checkpoint.latest(os.path.join(run_dir, "checkpoints"))[1]["state"]


def test_default_budget_is_twelve_minutes_or_what_is_left_of_the_run():
    from train.sagan.training import default_budget

    assert default_budget(0.5) == 12.0  # fast machine: 12 minutes, the run ends by 14
    assert default_budget(3.1) == pytest.approx(10.9)  # 3.1 minutes of data and classifier
    assert default_budget(13.8) == 1.0  # never less than a minute


@pytest.mark.slow
def test_default_budget_counts_the_whole_run(tiny_run):
    budget = json.load(open(os.path.join(tiny_run, "config.json")))["train"]["max_minutes"]
    # 11 less what the data and the classifier took: more than 11 less the whole run's
    # wall time, and a number in config.json (resume reads it).
    assert 11.0 - _TINY_RUN_MINUTES[tiny_run] < budget < 11.0


@pytest.mark.slow
def test_tiny_run_losses_finite_fid_falls_and_contract(tiny_run):
    metrics = json.load(open(os.path.join(tiny_run, "metrics.json")))
    for key in ("fid", "kid", "fid_floor", "class_accuracy"):
        assert metrics[key] is not None and np.isfinite(metrics[key]), key
    state = _state(tiny_run)
    for entry in state["history"]:
        assert np.isfinite(entry["d_loss"]) and np.isfinite(entry["g_loss"])
    # The per-epoch signal: FID, class accuracy and consistency after every epoch, plotted.
    # (Whether FID falls is not asserted: 16 steps and a 2-epoch classifier decide nothing;
    # the default run's figures are in benchmarks/results.md.)
    for key in ("fid_quick_history", "class_accuracy_history", "consistent_history"):
        assert len(metrics[key]) == 2 and all(np.isfinite(v) for v in metrics[key]), key
    assert np.isfinite(metrics["initial_fid_quick"])
    config = json.load(open(os.path.join(tiny_run, "config.json")))
    assert config["kind"] == "sagan" and config["model"]["num_classes"] == 4
    for name in (
        "model.keras",
        "discriminator.keras",
        "classifier.keras",
        "calibration.npz",
        "samples.png",
        "attention.png",
        "progress.png",
        "samples/epoch_002.png",
        "vocab/classes.txt",
    ):
        assert os.path.exists(os.path.join(tiny_run, name)), name
    assert os.listdir(os.path.join(tiny_run, "logs"))


@pytest.mark.slow
def test_build_trainer_builds_what_the_command_trained(tiny_run):
    """train.sagan.build_trainer, the benchmarks' SAGAN, with the run's flags: the run's
    training config and a generator of the run's weight shapes (so a default that moves
    moves the benchmarks with it)."""
    import keras

    from train.sagan import build_trainer

    config = json.load(open(os.path.join(tiny_run, "config.json")))
    g, d, ema, trainer, train_cfg = build_trainer(32, 3, 4, TINY)
    # max_minutes: the run resolves the default budget when it starts (resume reads it).
    assert {k: v for k, v in train_cfg.items() if k != "max_minutes"} == {
        k: v for k, v in config["train"].items() if k != "max_minutes"
    }
    saved = keras.models.load_model(os.path.join(tiny_run, "model.keras"), compile=False)
    assert [tuple(w.shape) for w in g.weights] == [tuple(w.shape) for w in saved.weights]
    assert ema is not None and trainer.r1 == config["train"]["r1"] > 0


def _label_and_noise_shares(run_dir, classes=4, noises=8):
    """Shares of the generated images' variance explained by the label and by the noise."""
    import keras

    g = keras.models.load_model(os.path.join(run_dir, "model.keras"), compile=False)
    latent = g.inputs[0].shape[-1] if g.inputs[0].name == "noise" else g.inputs[1].shape[-1]
    noise = np.random.default_rng(5).normal(size=(noises, latent)).astype("float32")
    feed = {
        "noise": np.tile(noise, (classes, 1)),
        "label": np.repeat(np.arange(classes), noises).astype("int32"),
    }
    images = np.asarray(g(feed, training=False)).reshape(classes, noises, -1)
    between = images.mean(axis=1).var(axis=0).mean()  # how far the class means are apart
    within = images.var(axis=1).mean()  # how much the noise moves an image of one class
    total = between + within
    return between / total, within / total


@pytest.mark.slow
def test_tiny_run_generator_follows_the_label_and_the_noise(tiny_run):
    """The old default's samples were the same picture in every class row (the label had
    no visible effect); then, without mode seeking, one picture per class (no effect of
    the noise). Both must explain a real share of what the generator draws."""
    label_share, noise_share = _label_and_noise_shares(tiny_run)
    assert label_share > 0.1, label_share
    assert noise_share > 0.1, noise_share


@pytest.mark.slow
def test_learning_rates_fall_linearly_over_the_second_half_of_the_budget(tiny_run):
    """--lr-decay-from 0.5 (TINY): constant rates for the first half of the steps, then
    linear to 0. The checkpoint holds the rates of the last step, D step 15 of 16
    (2 epochs of 256 // 32 batches; the time limit is far away): lr * (1/16) / 0.5."""
    saved = np.load(checkpoint.latest(os.path.join(tiny_run, "checkpoints"))[0])
    train_cfg = json.load(open(os.path.join(tiny_run, "config.json")))["train"]
    total = 2 * (256 // 32)
    for name, lr in (("g_opt", train_cfg["lr_g"]), ("d_opt", train_cfg["lr_d"])):
        expected = lr * (1.0 - (total - 1) / total) / 0.5
        np.testing.assert_allclose(saved[f"{name}/learning_rate"], expected, rtol=1e-6)


def _grid_of(model_path, config):
    import keras

    from train.sagan.training import _fixed_latents

    g = keras.models.load_model(model_path, compile=False)
    fixed = _fixed_latents(config["model"], config["train"]["seed"])
    return np.asarray(g.predict_on_batch(fixed))


def _png(path):
    from PIL import Image

    return np.asarray(Image.open(path), dtype=np.int16)


def _expected_kept(metrics):
    """1-based epoch --keep best should keep: the lowest quick FID among the epochs whose
    worst class reached 90%, else the lowest quick FID of all."""
    fids, worst = metrics["fid_quick_history"], metrics["class_min_history"]
    drawn = [i for i, m in enumerate(worst) if m is not None and m >= 0.9]
    return (min(drawn, key=fids.__getitem__) if drawn else int(np.argmin(fids))) + 1


def test_keep_best_prefers_epochs_that_draw_every_class():
    from train.sagan.training import best_key

    def kept(entries):
        best = None
        for epoch, (fid, worst) in enumerate(entries, start=1):
            key = best_key({"fid_quick": fid, "class_min_quick": worst})
            if key is not None and (best is None or key < best[1]):
                best = (epoch, key)  # as train.engine keeps the best
        return best[0]

    # Epoch 4 has the lowest FID but lost a class; epoch 3 is the best that draws all.
    history = [(300.0, 0.95), (200.0, 0.5), (250.0, 0.92), (150.0, 0.8), (260.0, 0.99)]
    assert kept(history) == 3
    metrics = {"fid_quick_history": [f for f, _ in history]}
    assert _expected_kept({**metrics, "class_min_history": [w for _, w in history]}) == 3
    # No epoch draws every class: the lowest FID, as before.
    assert kept([(300.0, 0.5), (150.0, 0.2), (200.0, 0.89)]) == 2
    # Unconditional runs have no classes: the lowest FID.
    assert kept([(300.0, None), (150.0, None), (200.0, None)]) == 2
    # An epoch without a quick FID (--epoch-eval-samples 0) is never kept.
    assert best_key({"fid_quick": None, "class_min_quick": 1.0}) is None


@pytest.mark.slow
def test_model_keras_is_the_epoch_with_the_lowest_quick_fid(tiny_run, tmp_path):
    """--keep best (default): model.keras is the sampler of the epoch whose quick FID was
    lowest (among the epochs that draw every class, if any); its sample grid is that
    epoch's samples/epoch_NNN.png."""
    from train.sagan.figures import save_sample_grid
    from train.sagan.training import GRID_COLUMNS

    metrics = json.load(open(os.path.join(tiny_run, "metrics.json")))
    config = json.load(open(os.path.join(tiny_run, "config.json")))
    kept = _expected_kept(metrics)
    assert metrics["keep"] == "best" and metrics["kept_epoch"] == kept
    save_sample_grid(
        _grid_of(os.path.join(tiny_run, "model.keras"), config),
        GRID_COLUMNS,
        str(tmp_path / "grid.png"),
    )
    ours = _png(tmp_path / "grid.png")
    assert (
        np.abs(ours - _png(os.path.join(tiny_run, "samples", f"epoch_{kept:03d}.png"))).max() <= 1
    )
    for other in range(1, len(metrics["fid_quick_history"]) + 1):
        if other != kept:  # a different epoch's grid differs (the comparison can fail)
            assert (
                np.abs(
                    ours - _png(os.path.join(tiny_run, "samples", f"epoch_{other:03d}.png"))
                ).max()
                > 1
            )


@pytest.mark.slow
def test_resume_continues_from_the_checkpoint(tiny_run, tmp_path):
    import shutil

    from train.cli import main

    copy = str(tmp_path / "run")
    shutil.copytree(tiny_run, copy)
    assert main(["sagan", "--out", copy, "--resume", "--epochs", "3"]) == 0
    state = _state(copy)
    assert state["epoch"] == 3 and len(state["history"]) == 3 and state["step"] == 24
    assert state["history"][:2] == _state(tiny_run)["history"]
    # The kept generator travels in the checkpoint: the best of all three epochs is kept.
    metrics = json.load(open(os.path.join(copy, "metrics.json")))
    assert metrics["kept_epoch"] == _expected_kept(metrics)


@pytest.mark.slow
def test_generator_export_gpu_clean_and_equal_to_keras(shared_runs, tmp_path):
    """The pages' tiny SAGAN run and its two exports (docs/sagan.md's commands, shared
    with tests/test_docs.py and tests/zoo/test_library_load.py), and an fp16 TFLite."""
    import keras
    import tensorflow as tf

    from export.check import check_file
    from export.tflite import export_tflite
    from export.verify import resolve_version_dir

    run = shared_runs.command("train", tiny.PAGE_RUNS["sagan"])
    paths = {
        "none": shared_runs.command(
            "export", ["tflite", run, "--out", "g.tflite", "--static-shape"]
        ),
        "fp16": str(tmp_path / "g_fp16.tflite"),
    }
    export_tflite(run, paths["fp16"], quantize="fp16", static_shape=True)
    generator = keras.models.load_model(os.path.join(run, "model.keras"))
    rng = np.random.default_rng(3)
    noise = rng.standard_normal((3, 16)).astype("float32")
    labels = np.array([0, 3, 1], "int32")
    want = (np.asarray(generator.predict_on_batch({"noise": noise, "label": labels})) + 1) / 2
    from ai_edge_litert.interpreter import Interpreter

    for quantize, atol in (("none", 1e-5), ("fp16", 1e-2)):
        path = paths[quantize]
        assert check_file(path, "gpu") == [], quantize
        runner = Interpreter(model_path=path).get_signature_runner("serving_default")
        got = np.concatenate(
            [runner(noise=noise[i : i + 1], label=labels[i : i + 1])["image"] for i in range(3)]
        )
        assert got.shape == (3, 32, 32, 3)
        np.testing.assert_allclose(got, want, atol=atol)
    base = shared_runs.command("export", ["savedmodel", run, "--out", "serving/sagan"])
    loaded = tf.saved_model.load(resolve_version_dir(base))
    out = loaded.signatures["generate"](noise=tf.constant(noise), label=tf.constant(labels))[
        "image"
    ]
    assert out.dtype == tf.uint8
    assert np.max(np.abs(out.numpy().astype(int) - np.round(want * 255).astype(int))) <= 1
    with open(os.path.join(run, "config.json")) as f:
        num_classes = json.load(f)["model"]["num_classes"]
    for bad in (-1, num_classes):
        with pytest.raises(tf.errors.InvalidArgumentError, match="label must be"):
            loaded.signatures["generate"](noise=tf.constant(noise[:1]), label=tf.constant([bad]))


@pytest.mark.slow
def test_zoo_generate_cli(tiny_run, tmp_path):
    from zoo.generate import main

    out = str(tmp_path / "grid.png")
    assert main([tiny_run, "--class", "square", "--num", "4", "--out", out]) == 0
    from PIL import Image

    assert Image.open(out).size == ((4 * 33 + 1) * 2, (33 + 1) * 2)
    # Each tile is the generator's image for the noise of --seed 0 and class 1 ("square"),
    # tanh -> [0, 255], drawn 2x with 1-pixel gaps (computed here from model.keras).
    import keras

    model = keras.saving.load_model(os.path.join(tiny_run, "model.keras"), compile=False)
    latent = model.input["noise"].shape[-1]
    noise = np.random.default_rng(0).standard_normal((4, latent)).astype("float32")
    want = np.asarray(model({"noise": noise, "label": np.ones(4, "int32")}, training=False))
    want = np.clip(np.round((want + 1.0) * 127.5), 0, 255)
    png = np.asarray(Image.open(out), np.int16)[::2, ::2]
    for i in range(4):
        tile = png[1 : 1 + 32, 1 + 33 * i : 1 + 33 * i + 32]
        assert np.abs(tile - want[i]).max() <= 1
    assert main([tiny_run, "--class", "9", "--out", str(tmp_path / "x.png")]) == 2


# ---------------------------------------------------------------- bad inputs
def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "train", "sagan", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _write_images(folder, sizes):
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    for i, size in enumerate(sizes):
        Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(os.path.join(folder, f"{i}.png"))


@pytest.mark.slow
def test_bad_inputs_one_line_exit_2_nothing_overwritten(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "config.json").write_text('{"kind": "sagan"}')
    empty = tmp_path / "empty"
    (empty / "cats").mkdir(parents=True)
    (empty / "cats" / "notes.txt").write_text("no images here")
    mixed = tmp_path / "mixed"
    _write_images(mixed / "a", [32, 32])
    _write_images(mixed / "b", [40])
    odd = tmp_path / "odd"
    _write_images(odd / "a", [48, 48])
    cases = [
        (["--image-dir", str(empty)], "has no images"),
        (["--image-dir", str(mixed)], "mixed sizes"),
        (["--image-dir", str(odd)], "power of two"),
        (["--image-size", "48"], "--image-size must be a power of two >= 32"),
        (["--image-dir", str(tmp_path / "missing")], "not a directory"),
        (["--class-embedding", "-1"], "--class-embedding must be >= 0, got -1"),
        (["--mode-seeking", "-0.5"], "--mode-seeking must be >= 0, got -0.5"),
        (["--class-loss", "nan"], "--class-loss must be >= 0, got nan"),
        (["--compare", "--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--verbose", "loud"], "--verbose must be auto, 0, 1 or 2, got 'loud'"),
        (["--lr-decay-from", "1.5"], "--lr-decay-from must be in [0, 1], got 1.5"),
    ]
    for extra, message in cases:
        out = tmp_path / "out"
        result = _cli("--out", str(out), *extra)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (extra, result.stderr)
        assert len(lines) == 1 and message in lines[0], (extra, result.stderr)
        assert not out.exists(), extra
    result = _cli("--out", str(existing))
    assert result.returncode == 2 and "already holds a run" in result.stderr
    assert (existing / "config.json").read_text() == '{"kind": "sagan"}'
    assert sorted(os.listdir(existing)) == ["config.json"]


# ---------------------------------------------------------------- zoo layers
@pytest.mark.slow
def test_zoo_blocks_pass_the_layer_contract():
    from tests.support.harness import run_layer_test
    from zoo.sagan.model import ClassEmbedding, DiscriminatorBlock, GeneratorBlock, ProjectionHead

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 4, 8)).astype("float32")
    labels = np.array([1, 0], "int32")
    batch_only = {"inputs": (0,), "labels": (0,)}
    run_layer_test(
        GeneratorBlock,
        {"filters": 6, "num_classes": 3, "seed": 1},
        {"inputs": x, "labels": labels},
        expected_output_shape=(2, 8, 8, 6),
        dynamic_axes=batch_only,
        tflite_static_and_dynamic=False,
    )
    run_layer_test(
        DiscriminatorBlock,
        {"filters": 6, "seed": 1},
        x,
        expected_output_shape=(2, 2, 2, 6),
        dynamic_axes={"inputs": (0,)},
        tflite_static_and_dynamic=False,
    )
    run_layer_test(
        ProjectionHead,
        {"num_classes": 3, "seed": 1},
        {"inputs": x, "labels": labels},
        expected_output_shape=(2, 1),
        dynamic_axes=batch_only,
        tflite_static_and_dynamic=False,
    )
    run_layer_test(
        ClassEmbedding,
        {"num_classes": 3, "dim": 5},
        {"labels": labels},
        expected_output_shape=(2, 5),
        dynamic_axes={"labels": (0,)},
        tflite_static_and_dynamic=False,
    )


@pytest.mark.slow
def test_image_dir_reader_labels_by_sub_folder(tmp_path):
    from train.sagan.images import load_image_dir

    _write_images(tmp_path / "a", [32] * 6)
    _write_images(tmp_path / "b", [32] * 4)
    data = load_image_dir(str(tmp_path), seed=0)
    assert data.class_names == ["a", "b"] and data.image_size == 32 and data.channels == 3
    assert len(data.train) + len(data.test) == 10 and len(data.test) == 1
    labels = np.concatenate([data.train_labels, data.test_labels])
    assert sorted(labels.tolist()) == [0] * 6 + [1] * 4


def test_tfds_reader_resizes_both_splits_and_caps_them(monkeypatch):
    """--dataset tfds:NAME through a stand-in builder (nothing downloaded): images resized
    to 32, labels and class names from the builder, --max-images caps the training split
    (over more than one batch of 1,024) and a fifth of it the test split."""
    import types

    import tensorflow as tf

    from train import tfds
    from train.sagan.images import load_tfds_images

    class Builder:
        info = types.SimpleNamespace(features={"label": types.SimpleNamespace(names=["a", "b"])})

        def as_dataset(self, split):
            n = 1100 if split == "train" else 300
            images = np.random.default_rng(0).integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
            return tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(n) % 2})

    monkeypatch.setattr(tfds, "open_builder", lambda name, data_dir=None: Builder())
    monkeypatch.setattr(tfds, "prepare", lambda builder, name: None)
    data = load_tfds_images("tfds:mnist", max_images=1030)
    assert data.train.shape == (1030, 32, 32, 1) and data.train.dtype == np.uint8
    assert data.test.shape == (206, 32, 32, 1) and data.test_labels.dtype == np.int32
    assert data.class_names == ["a", "b"]
    assert data.train_labels.tolist() == [i % 2 for i in range(1030)]
    assert data.source == {"name": "tfds:mnist", "image_size": 32, "train": 1030, "test": 206}


# The --compare tests' data and models (their training is stubbed).
_SMALL = ["--train-size", "64", "--test-size", "16", "--batch-size", "32", "--width", "4"]
_SMALL += ["--latent-dim", "8"]


def _stub_training(monkeypatch, metrics):
    """--compare's orchestration without training: each run writes metrics(config, has_attention)."""
    import train.sagan.training as sagan_run

    def fake_fit(run, resuming):
        g = run.models[0]
        has_attention = any(layer.name == "self_attention" for layer in g.layers)
        atomic.write_json(os.path.join(run.out, "metrics.json"), metrics(run.config, has_attention))
        return 0

    monkeypatch.setattr(sagan_run, "_fit_and_finish", fake_fit)
    monkeypatch.setattr(sagan_run, "get_classifier", lambda *a, **k: (None, {}))


@pytest.mark.slow
def test_compare_trains_one_run_with_and_one_without_attention(tmp_path, monkeypatch, capsys):
    """The orchestration of --compare (training itself is replaced by a stub)."""
    from train.cli import main

    _stub_training(
        monkeypatch,
        lambda config, has_attention: {
            "fid": 1.0 if has_attention else 2.0,
            "fid_floor": 0.1,
            "has_attention": has_attention,
        },
    )
    out = str(tmp_path / "cmp")
    assert main(["sagan", "--compare", "--seeds", "1", "--out", out, *_SMALL]) == 0
    runs = {
        name: json.load(open(os.path.join(out, name, "config.json")))["model"][
            "attention_resolution"
        ]
        for name in ("attention", "no_attention")
    }
    assert runs == {"attention": 16, "no_attention": None}
    assert (
        json.load(open(os.path.join(out, "no_attention", "metrics.json")))["has_attention"] is False
    )
    assert "FID with attention: 1.0   without: 2.0" in capsys.readouterr().out


@pytest.mark.slow
def test_compare_over_seeds_reports_mean_and_spread(tmp_path, monkeypatch):
    """--compare --seeds 3: six runs (model seeds 5, 6, 7 on one data set), and per arm
    the mean and sample standard deviation of FID, class accuracy and consistency."""
    from train.cli import main

    fids = {}

    def metrics(config, has_attention):
        seed = config["train"]["seed"]
        assert config["train"]["data_seed"] == 5 and config["model"]["seed"] == seed
        fids[(has_attention, seed)] = seed * (1.0 if has_attention else 2.0)
        return {
            "fid": fids[(has_attention, seed)],
            "fid_floor": 0.1,
            "class_accuracy": 0.1 * seed,
            "consistent": 0.5,
            "kid": 1.0,
            "real_consistent": 0.9,
        }

    _stub_training(monkeypatch, metrics)
    out = str(tmp_path / "cmp")
    assert main(["sagan", "--compare", "--seed", "5", "--out", out, *_SMALL]) == 0
    assert sorted(fids) == [(a, s) for a in (False, True) for s in (5, 6, 7)]
    summary = {e["name"]: e for e in json.load(open(os.path.join(out, "compare.json")))["summary"]}
    for arm, factor in (("attention", 1.0), ("no_attention", 2.0)):
        values = [factor * s for s in (5, 6, 7)]
        assert summary[arm]["seeds"] == 3
        assert summary[arm]["fid_mean"] == pytest.approx(np.mean(values))
        assert summary[arm]["fid_std"] == pytest.approx(np.std(values, ddof=1), abs=1e-4)
        assert summary[arm]["class_accuracy_mean"] == pytest.approx(0.6)
        assert summary[arm]["consistent_std"] == 0
    text = open(os.path.join(out, "compare.md")).read()
    assert "| attention | 3 | 6 ± 1 |" in text and "| no_attention | 3 | 12 ± 2 |" in text


@pytest.mark.slow
def test_data_seed_reproduces_one_compare_run(tmp_path, monkeypatch):
    """`--seed 6 --data-seed 5` trains what `--compare --seed 5` trains for model seed 6
    (the same data, classifier seed, initial G and D and settings), and so does replaying
    that run's config.json; `--seed 6` alone makes other data (training is stubbed)."""
    import train.sagan.fid_classifier as fid_classifier
    import train.sagan.training as sagan_run
    from train.cli import main

    seen, classifier_seeds = {}, {}

    def fake_fit(run, resuming):
        g, d, _ = run.models
        seen[os.path.relpath(run.out, tmp_path)] = (
            run.config,
            run.data,
            g.get_weights(),
            d.get_weights(),
        )
        metrics = {"fid": 1.0, "fid_floor": 0.1, "class_accuracy": 1.0, "consistent": 0.5}
        atomic.write_json(os.path.join(run.out, "metrics.json"), {**metrics, "kid": 1.0})
        return 0

    def fake_classifier(data, epochs, seed, **kwargs):
        classifier_seeds[len(classifier_seeds)] = seed
        return "classifier", {}

    monkeypatch.setattr(sagan_run, "_fit_and_finish", fake_fit)
    monkeypatch.setattr(fid_classifier, "train_classifier", fake_classifier)
    monkeypatch.setattr(fid_classifier, "save_cached", lambda *a, **k: None)
    small = [*_SMALL, "--max-minutes", "1"]

    def run(out, *flags):
        assert main(["sagan", "--out", str(tmp_path / out), *flags]) == 0
        return seen.get(out)

    run("cmp", "--compare", "--seed", "5", "--seeds", "2", *small)
    arm = seen[os.path.join("cmp", "attention_seed6")]
    assert classifier_seeds == {0: 5}
    plain = run("plain", "--seed", "6", "--data-seed", "5", *small)
    assert classifier_seeds == {0: 5, 1: 5}
    replay = run("replay", "--config", str(tmp_path / "cmp" / "attention_seed6" / "config.json"))
    assert classifier_seeds == {0: 5, 1: 5, 2: 5}
    for config, data, g_weights, d_weights in (plain, replay):
        for section in ("model", "discriminator", "train"):
            assert config[section] == arm[0][section], section
        assert config["train"]["seed"] == 6 and config["train"]["data_seed"] == 5
        np.testing.assert_array_equal(data.train, arm[1].train)
        np.testing.assert_array_equal(data.test_labels, arm[1].test_labels)
        for got, want in zip(g_weights + d_weights, arm[2] + arm[3]):
            np.testing.assert_array_equal(got, want)
    other = run("other", "--seed", "6", *small)
    assert classifier_seeds[3] == 6 and other[0]["train"]["data_seed"] == 6
    assert not np.array_equal(other[1].train, arm[1].train)
    np.testing.assert_array_equal(other[2][0], arm[2][0])  # the models follow --seed alone


# The first digit of scikit-learn's `load_digits()` as its tutorial prints it
# ("An introduction to machine learning with scikit-learn": `digits.images[0]`, a 0).
FIRST_DIGIT = [
    [0, 0, 5, 13, 9, 1, 0, 0],
    [0, 0, 13, 15, 10, 15, 5, 0],
    [0, 3, 15, 2, 0, 11, 8, 0],
    [0, 4, 12, 0, 0, 8, 8, 0],
    [0, 5, 8, 0, 0, 9, 8, 0],
    [0, 4, 11, 0, 1, 12, 7, 0],
    [0, 2, 14, 5, 10, 12, 0, 0],
    [0, 0, 6, 13, 10, 0, 0, 0],
]


@pytest.mark.slow
def test_digits_converter_writes_an_image_dir_of_sklearn_digits(tmp_path, capsys):
    """python -m train.sagan.digits: scikit-learn's digits (its file, which travels with the
    package) as a --image-dir folder (10 classes, 32x32); the first image, block-averaged
    back to 8x8, is the first digit as scikit-learn's tutorial prints it, and every image
    sits in the folder of its line's digit."""
    import csv
    import gzip
    import hashlib

    from PIL import Image

    from train.sagan.digits import DATA, main
    from train.sagan.images import load_image_dir

    # scikit-learn 1.9.1's sklearn/datasets/data/digits.csv.gz, byte for byte.
    with open(DATA, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert digest == "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    with gzip.open(DATA, "rt") as f:
        labels = [int(row[-1]) for row in csv.reader(f)]
    out = tmp_path / "digits"
    assert main([str(out)]) == 0
    data = load_image_dir(str(out), seed=0)
    assert data.class_names == [str(k) for k in range(10)] and data.image_size == 32
    assert len(data.train) + len(data.test) == len(labels) == 1797
    for digit in range(10):
        names = sorted(os.listdir(out / str(digit)))
        assert names == [f"{i:04d}.png" for i, label in enumerate(labels) if label == digit]
    image = np.asarray(Image.open(out / "0" / "0000.png"), np.float32)
    assert image.shape == (32, 32, 3) and np.all(image[..., 0] == image[..., 2])
    small = image[..., 0].reshape(8, 4, 8, 4).mean(axis=(1, 3))
    assert np.corrcoef(small.ravel(), np.ravel(FIRST_DIGIT))[0, 1] > 0.95
    # An existing, non-empty OUT_DIR is refused and left as it was.
    before = sorted(os.listdir(out / "3"))
    assert main([str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(os.listdir(out / "3")) == before


def test_projection_class_scores_are_the_per_class_projection_terms():
    """softmax over k of D(x, k) (the head's own call with each label) equals the softmax
    of `class_scores`: the unconditional term is the same for every class and cancels."""
    from zoo.sagan.model import ProjectionHead

    head = ProjectionHead(num_classes=3, seed=1)
    x = np.random.default_rng(4).normal(size=(5, 4, 4, 6)).astype("float32")
    head.build(x.shape, (5,))
    head.embed.kernel.assign(np.random.default_rng(5).normal(size=(3, 6)).astype("float32"))
    per_label = np.concatenate(
        [np.asarray(head(x, np.full(5, k, "int32"))) for k in range(3)], axis=1
    )
    scores = np.asarray(head.class_scores(x))
    assert scores.shape == (5, 3)
    np.testing.assert_allclose(per_label - per_label[:, :1], scores - scores[:, :1], atol=1e-4)
