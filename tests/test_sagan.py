"""SAGAN: builders, FID/KID, a tiny training run (finite losses, FID falls, resume),
generator export (SavedModel uint8, TFLite fp32/fp16 batch 1 passing the GPU check,
LiteRT == Keras), zoo.generate, and CLI bad inputs (one line, exit 2, nothing lost)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import zoo
from train.fid import frechet_distance, kernel_inception_distance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


# ---------------------------------------------------------------- builders
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
    g16 = zoo.build("sagan_generator", image_size=64, width=4, latent_dim=8, attention_resolution=16)
    assert g16.get_layer("self_attention").input.shape[1] == 16
    none = zoo.build("sagan_generator", image_size=32, width=4, latent_dim=8, attention_resolution=None)
    assert not any(layer.name == "self_attention" for layer in none.layers)


@pytest.mark.parametrize("kwargs, message", [
    ({"image_size": 48}, "image_size=48"),
    ({"image_size": 16}, "image_size=16"),
    ({"attention_resolution": 32}, "attention_resolution=32"),
    ({"num_classes": 1}, "num_classes=1"),
])
def test_builder_bad_arguments(kwargs, message):
    for name in ("sagan_generator", "sagan_discriminator"):
        with pytest.raises(ValueError, match=message):
            zoo.build(name, **kwargs)


# ---------------------------------------------------------------- FID / KID
@pytest.mark.parametrize("jit_compile", [False, True])
def test_upsampling_gradient_is_the_2x2_block_sum(jit_compile):
    """G's upsampling: nearest-neighbour forward, and a gradient that compiles under XLA
    (TensorFlow's own, ResizeNearestNeighborGrad, does not)."""
    import tensorflow as tf

    from zoo.sagan import upsample_nearest_2x

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
    np.testing.assert_allclose(grad.numpy(), weights.reshape(2, 3, 2, 4, 2, 5).sum(axis=(2, 4)),
                               rtol=1e-6, atol=1e-6)


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
TINY = ["--epochs", "2", "--train-size", "256", "--test-size", "128", "--eval-samples", "128",
        "--epoch-eval-samples", "128", "--classifier-epochs", "2", "--width", "8",
        "--latent-dim", "16", "--seed", "1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from train.cli import main

    out = str(tmp_path_factory.mktemp("sagan") / "run")
    assert main(["sagan", "--out", out, *TINY]) == 0
    return out


def test_tiny_run_losses_finite_fid_falls_and_contract(tiny_run):
    metrics = json.load(open(os.path.join(tiny_run, "metrics.json")))
    for key in ("fid", "kid", "fid_floor", "class_accuracy"):
        assert metrics[key] is not None and np.isfinite(metrics[key]), key
    state = json.load(open(os.path.join(tiny_run, "checkpoints", "state.json")))
    for entry in state["history"]:
        assert np.isfinite(entry["d_loss"]) and np.isfinite(entry["g_loss"])
    assert metrics["fid_quick_history"][-1] < metrics["initial_fid_quick"]
    config = json.load(open(os.path.join(tiny_run, "config.json")))
    assert config["kind"] == "sagan" and config["model"]["num_classes"] == 4
    for name in ("model.keras", "discriminator.keras", "classifier.keras", "calibration.npz",
                 "samples.png", "attention.png", "samples/epoch_002.png", "vocab/classes.txt"):
        assert os.path.exists(os.path.join(tiny_run, name)), name
    assert os.listdir(os.path.join(tiny_run, "logs"))


def test_resume_continues_from_the_checkpoint(tiny_run, tmp_path):
    import shutil

    from train.cli import main

    copy = str(tmp_path / "run")
    shutil.copytree(tiny_run, copy)
    assert main(["sagan", "--out", copy, "--resume", "--epochs", "3"]) == 0
    state = json.load(open(os.path.join(copy, "checkpoints", "state.json")))
    assert state["epoch"] == 3 and len(state["history"]) == 3 and state["d_steps"] == 24
    assert state["history"][:2] == json.load(
        open(os.path.join(tiny_run, "checkpoints", "state.json")))["history"]


def test_generator_export_gpu_clean_and_equal_to_keras(tiny_run, tmp_path):
    import tensorflow as tf

    from export.check import check_file
    from export.savedmodel import export_savedmodel
    from export.tflite import export_tflite

    import keras

    generator = keras.models.load_model(os.path.join(tiny_run, "model.keras"))
    rng = np.random.default_rng(3)
    noise = rng.standard_normal((3, 16)).astype("float32")
    labels = np.array([0, 3, 1], "int32")
    want = (np.asarray(generator.predict_on_batch({"noise": noise, "label": labels})) + 1) / 2
    from ai_edge_litert.interpreter import Interpreter

    for quantize, atol in (("none", 1e-5), ("fp16", 1e-2)):
        path = str(tmp_path / f"g_{quantize}.tflite")
        export_tflite(tiny_run, path, quantize=quantize, static_shape=True)
        assert check_file(path, "gpu") == [], quantize
        runner = Interpreter(model_path=path).get_signature_runner("serving_default")
        got = np.concatenate([runner(noise=noise[i:i + 1], label=labels[i:i + 1])["image"]
                              for i in range(3)])
        assert got.shape == (3, 32, 32, 3)
        np.testing.assert_allclose(got, want, atol=atol)
    version = export_savedmodel(tiny_run, str(tmp_path / "serving" / "sagan"))
    loaded = tf.saved_model.load(version)
    out = loaded.signatures["generate"](noise=tf.constant(noise), label=tf.constant(labels))["image"]
    assert out.dtype == tf.uint8
    assert np.max(np.abs(out.numpy().astype(int) - np.round(want * 255).astype(int))) <= 1
    with open(os.path.join(tiny_run, "config.json")) as f:
        num_classes = json.load(f)["model"]["num_classes"]
    for bad in (-1, num_classes):
        with pytest.raises(tf.errors.InvalidArgumentError, match="label must be"):
            loaded.signatures["generate"](noise=tf.constant(noise[:1]), label=tf.constant([bad]))


def test_zoo_generate_cli(tiny_run, tmp_path):
    from zoo.generate import main

    out = str(tmp_path / "grid.png")
    assert main([tiny_run, "--class", "square", "--num", "4", "--out", out]) == 0
    from PIL import Image

    assert Image.open(out).size == ((4 * 33 + 1) * 2, (33 + 1) * 2)
    assert main([tiny_run, "--class", "9", "--out", str(tmp_path / "x.png")]) == 2


# ---------------------------------------------------------------- bad inputs
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "train", "sagan", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)


def _write_images(folder, sizes):
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    for i, size in enumerate(sizes):
        Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(os.path.join(folder, f"{i}.png"))


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
def test_zoo_blocks_pass_the_layer_contract():
    from tests.harness import run_layer_test
    from zoo.sagan import DiscriminatorBlock, GeneratorBlock, ProjectionHead

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 4, 8)).astype("float32")
    labels = np.array([1, 0], "int32")
    batch_only = {"inputs": (0,), "labels": (0,)}
    run_layer_test(GeneratorBlock, {"filters": 6, "num_classes": 3, "seed": 1},
                   {"inputs": x, "labels": labels}, expected_output_shape=(2, 8, 8, 6),
                   dynamic_axes=batch_only, tflite_static_and_dynamic=False)
    run_layer_test(DiscriminatorBlock, {"filters": 6, "seed": 1}, x,
                   expected_output_shape=(2, 2, 2, 6), dynamic_axes={"inputs": (0,)},
                   tflite_static_and_dynamic=False)
    run_layer_test(ProjectionHead, {"num_classes": 3, "seed": 1}, {"inputs": x, "labels": labels},
                   expected_output_shape=(2, 1), dynamic_axes=batch_only,
                   tflite_static_and_dynamic=False)


def test_image_dir_reader_labels_by_sub_folder(tmp_path):
    from train.data.images import load_image_dir

    _write_images(tmp_path / "a", [32] * 6)
    _write_images(tmp_path / "b", [32] * 4)
    data = load_image_dir(str(tmp_path), seed=0)
    assert data.class_names == ["a", "b"] and data.image_size == 32 and data.channels == 3
    assert len(data.train) + len(data.test) == 10 and len(data.test) == 1
    labels = np.concatenate([data.train_labels, data.test_labels])
    assert sorted(labels.tolist()) == [0] * 6 + [1] * 4


def test_compare_trains_one_run_with_and_one_without_attention(tmp_path, monkeypatch, capsys):
    """The orchestration of --compare (training itself is replaced by a stub)."""
    import train.sagan_run as sagan_run
    from train.cli import main

    def fake_fit(out, config, data, g, d, ema, *rest, **kwargs):
        has_attention = any(layer.name == "self_attention" for layer in g.layers)
        fid = 1.0 if has_attention else 2.0
        sagan_run.rundir.atomic_write_json(os.path.join(out, "metrics.json"),
                                           {"fid": fid, "fid_floor": 0.1, "has_attention": has_attention})
        return 0

    monkeypatch.setattr(sagan_run, "_fit_and_finish", fake_fit)
    monkeypatch.setattr(sagan_run, "get_classifier", lambda *a, **k: (None, {}))
    out = str(tmp_path / "cmp")
    assert main(["sagan", "--compare", "--out", out, "--train-size", "64", "--test-size", "16",
                 "--width", "4", "--latent-dim", "8"]) == 0
    runs = {name: json.load(open(os.path.join(out, name, "config.json")))["model"]["attention_resolution"]
            for name in ("attention", "no_attention")}
    assert runs == {"attention": 16, "no_attention": None}
    assert json.load(open(os.path.join(out, "no_attention", "metrics.json")))["has_attention"] is False
    assert "FID with attention: 1.0   without: 2.0" in capsys.readouterr().out
