"""Training under Keras's JAX backend (#20): each model trains one short epoch with
`--backend jax` in a child process, which then saves its own outputs (tag probabilities,
teacher-forced logits and greedy translations, generated images) of the run's model.keras
under JAX. A fresh TensorFlow process (one for the three runs) loads each run, computes
the same outputs, exports it (SavedModel, TFLite; the export CLI checks each against
Keras) and runs the exports: every output must equal JAX's to float tolerance.

The tiny settings are the ones the tests share (tests/support/tiny.py).
"""

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.support import paths, tiny
from tests.support.backends import jax_env
from tests.support.runs import training_env
from train import checkpoint

SENTENCES = [["I", "saw", "a", "saw", "."], ["they", "can", "can", "the", "fish"]]
TEXTS = ["abcde", "edcab"]
CLASSES = [0, 1, 2, 3]


@functools.cache
def _jax_cache():
    """One JAX compilation cache folder for this test process's children (made on first
    use, removed at exit): the resume test's two seq2seq runs compile the programs the
    module's one-epoch seq2seq run compiled (same model, shapes and flags) and load
    them instead, the same executables (a one-epoch child: ~45 -> ~18 CPU s)."""
    path = tempfile.mkdtemp(prefix="zoo-jax-cache-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _env(backend, xla_flags=""):
    """A child's environment: `training_env()` for "tensorflow", else `jax_env` with the
    fixed hash seed and the shared compilation cache."""
    if backend == "tensorflow":
        return training_env()
    return jax_env(
        xla_flags,
        PYTHONHASHSEED="0",
        JAX_COMPILATION_CACHE_DIR=_jax_cache(),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )


def _child(backend, *args, xla_flags="", timeout=900):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.train.test_jax_training", *args],
        cwd=paths.ROOT,
        env=_env(backend, xla_flags),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _flags(kind):
    """The tests' shared tiny flags (one epoch)."""
    return list(tiny.FLAGS[kind])


# ------------------------------------------------------------------ in the children
def outputs(kind, run):
    """The outputs compared across backends, from the run's model.keras."""
    import zoo

    task = zoo.load(run)
    if kind == "tagger":
        from zoo.tagger.model import pad_tokens

        model = task.model
        ids = {k: np.asarray(v) for k, v in model.encode_tf(pad_tokens(SENTENCES)).items()}
        probs = np.asarray(model.core(ids, training=False), np.float32)
        tags = [t for row in task.tag(SENTENCES) for _, t in row]
        return {"probs": probs, "tags": np.array(tags)}
    if kind == "seq2seq":
        model = task.model
        rng = np.random.default_rng(0)
        feed = {
            "source_ids": rng.integers(4, 10, (2, 6)).astype("int32"),
            "target_ids": rng.integers(4, 10, (2, 7)).astype("int32"),
        }
        logits = np.asarray(model(feed, training=False), np.float32)
        return {"logits": logits, "translations": np.array(task.translate(TEXTS))}
    return {"images": task.generate(CLASSES, seed=0)}


def _train_under_jax(jobs):
    """Each job of the JSON file `jobs` in turn, in this one JAX process (one start-up,
    and the programs JAX compiled op by op for one run serve the next): {"kind", "argv"
    (`python -m train KIND ARGV`), "stderr" (the file the command's stderr goes to),
    "outputs" (where `outputs` of the run goes, or null), "copy" ([from, to]: a run
    copied before the command, or null)}."""
    import contextlib
    import io

    import keras

    from train.cli import main

    with open(jobs) as f:
        todo = json.load(f)
    for job in todo:
        if job["copy"]:
            shutil.copytree(*job["copy"])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main([job["kind"], *job["argv"]])
        with open(job["stderr"], "w") as f:
            f.write(err.getvalue())
        assert code == 0, (job, err.getvalue()[-3000:])
        assert keras.backend.backend() == "jax"
        if job["outputs"]:
            run = job["argv"][job["argv"].index("--out") + 1]
            np.savez(job["outputs"], **outputs(job["kind"], run))


def _check_under_tensorflow(kind, run, result, work):
    import keras

    from export.__main__ import main as export_main

    assert keras.backend.backend() == "tensorflow"
    want = dict(np.load(result))
    got = outputs(kind, run)
    _compare(kind, got, want, "Keras (TensorFlow)")
    saved = os.path.join(work, "serving")
    lite = os.path.join(work, "model.tflite")
    assert export_main(["savedmodel", run, "--out", saved]) == 0
    assert export_main(["tflite", run, "--out", lite]) == 0
    import zoo

    for name, path in (("SavedModel", saved), ("TFLite", lite)):
        if kind == "seq2seq" and name == "TFLite":
            # The one-file greedy loop gives tokens only, and a one-epoch model's logits
            # nearly tie (LiteRT's float order picked 'bbb' over '' once): the export
            # itself compared LiteRT's outputs with Keras's, which equal JAX's above.
            continue
        task = zoo.load(path)
        if kind == "tagger":
            got = {"tags": np.array([t for row in task.tag(SENTENCES) for _, t in row])}
        elif kind == "seq2seq":
            got = {"translations": np.array(task.translate(TEXTS))}
        else:
            got = {"images": task.generate(CLASSES, seed=0)}
        _compare(kind, got, want, name)


def _compare(kind, got, want, where):
    for key, value in got.items():
        if value.dtype.kind in "US":
            if kind == "tagger" and "probs" in want:
                # A tag may part only where JAX's two best probabilities (nearly) tie.
                top2 = np.sort(want["probs"], axis=-1)[..., -2:]
                margin = top2[..., 1] - top2[..., 0]
                clear = np.concatenate([m[: len(s)] for m, s in zip(margin, SENTENCES)]) > 1e-4
                assert (value[clear] == want[key][clear]).all(), (where, key, value, want[key])
            else:
                assert value.tolist() == want[key].tolist(), (where, key, value, want[key])
        else:
            np.testing.assert_allclose(value, want[key], atol=2e-5, rtol=1e-4, err_msg=where)


def _check_all_under_tensorflow(jobs, report):
    """`_check_under_tensorflow` for each (kind, run, result, work) in the JSON file
    `jobs`, in this one TensorFlow process; {kind: "ok" or the failure's traceback} to
    the JSON file `report`."""
    import traceback

    with open(jobs) as f:
        todo = json.load(f)
    done = {}
    for kind, run, result, work in todo:
        try:
            _check_under_tensorflow(kind, run, result, work)
            done[kind] = "ok"
        except Exception:
            done[kind] = traceback.format_exc()
    with open(report, "w") as f:
        json.dump(done, f)


if __name__ == "__main__":
    step = sys.argv[1]
    if step == "train":
        _train_under_jax(sys.argv[2])
    else:
        _check_all_under_tensorflow(*sys.argv[2:4])


# ------------------------------------------------------------------ tests
def _small_tagger_data(folder):
    """Flags for a small embedded tagging set (CoNLL-U files in `folder`) taken in one
    batch: JAX compiles the step again for every new batch shape, and the default data's
    length-bucketed batches cost most of a minute of compiling for what this file
    checks (a JAX-trained run's outputs under TensorFlow), which any run shows."""
    from tests.train.test_checkpoint import _write_conllu
    from train.tagger import embedded

    data = embedded.generate(seed=1, train_size=240, dev_size=40, test_size=60)
    flags = ["--batch-size", "256"]
    for split in ("train", "dev", "test"):
        _write_conllu(folder / f"{split}.conllu", getattr(data, split))
        flags += [f"--{split}-file", str(folder / f"{split}.conllu")]
    return flags


KINDS = ["tagger", "seq2seq", "sagan"]


# The train child's host devices: two, so the DataParallel run ("two") trains in the
# child that trains the rest (one JAX start-up fewer). Every other run uses one of them
# (`--strategy` default: "1 x cpu" in its runtime, as each test checks).
TWO_DEVICES = "--xla_force_host_platform_device_count=2"


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    """{name: (run, outputs .npz or None, stderr)} of the module's runs under JAX, all
    trained by one train child: one tiny epoch of each kind; for the resume test,
    seq2seq for two epochs in one go ("whole") and a copy of the one-epoch seq2seq run
    resumed to two ("resumed"); and for the DataParallel test, the one-epoch seq2seq run
    with --strategy mirrored over the child's two host devices ("two"), whose one-device
    run is the one-epoch seq2seq run."""
    base = tmp_path_factory.mktemp("jax")
    jobs, runs = [], {}

    def job(name, kind, extra=(), outputs=True, copy=None):
        run = str(base / name / "run")
        (base / name).mkdir()
        result = str(base / name / "jax_outputs.npz") if outputs else None
        stderr = str(base / name / "stderr.txt")
        argv = ["--backend", "jax", "--out", run, *_flags(kind), *extra]
        jobs.append(dict(kind=kind, argv=argv, stderr=stderr, outputs=result, copy=copy))
        runs[name] = (run, result, stderr)

    job("tagger", "tagger", _small_tagger_data(base))
    for kind in KINDS[1:]:
        job(kind, kind)
    job("whole", "seq2seq", ["--epochs", "2"], outputs=False)
    job(
        "resumed",
        "seq2seq",
        ["--resume", "--epochs", "2"],
        outputs=False,
        copy=[runs["seq2seq"][0], str(base / "resumed" / "run")],
    )
    job("two", "seq2seq", ["--strategy", "mirrored"], outputs=False)
    (base / "jobs.json").write_text(json.dumps(jobs))
    _child("jax", "train", str(base / "jobs.json"), xla_flags=TWO_DEVICES)
    return {
        name: (run, result, open(stderr).read()) for name, (run, result, stderr) in runs.items()
    }


@pytest.fixture(scope="module")
def jax_run(jax_runs):
    """`jax_run(kind)`: (run, outputs .npz, stderr) of one tiny epoch of `kind` under JAX."""
    return jax_runs.__getitem__


@pytest.fixture(scope="module")
def checked_under_tensorflow(jax_run, tmp_path_factory):
    """{kind: "ok" or the traceback} of `_check_under_tensorflow` on each kind's JAX
    run, all in one fresh TensorFlow child (one TensorFlow start-up, not three)."""
    base = tmp_path_factory.mktemp("tf-check")
    jobs = []
    for kind in KINDS:
        run, result, _ = jax_run(kind)
        (base / kind).mkdir()
        jobs.append((kind, run, result, str(base / kind)))
    (base / "jobs.json").write_text(json.dumps(jobs))
    _child("tensorflow", "check", str(base / "jobs.json"), str(base / "report.json"))
    return json.loads((base / "report.json").read_text())


@pytest.mark.slow  # JAX children train, a TF child loads and exports
@pytest.mark.parametrize("kind", KINDS)
def test_jax_trained_run_loads_and_exports_under_tensorflow(
    kind, jax_run, checked_under_tensorflow
):
    run, result, stderr = jax_run(kind)
    assert "backend jax, 1 x cpu, float32, XLA on" in stderr
    for name in ("config.json", "metrics.json"):
        with open(os.path.join(run, name)) as f:
            runtime = json.load(f)["runtime"]
        assert runtime["backend"] == "jax" and runtime["device"] == "cpu", runtime
    assert checked_under_tensorflow[kind] == "ok", checked_under_tensorflow[kind]


def _refused(capsys, argv, *needles):
    from train.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], err
    return err[0]


def test_device_gpu_refused_without_a_gpu(tmp_path, capsys):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    out = tmp_path / "run"
    for model in ("tagger", "seq2seq", "sagan"):
        _refused(capsys, [model, "--device", "gpu", "--out", str(out)], "--device gpu", "no GPU")
        assert not out.exists()


def test_backend_and_precision_flags_refused_with_one_line(tmp_path, capsys):
    out = str(tmp_path / "run")
    # This process imported Keras with TensorFlow: JAX cannot be selected any more.
    _refused(capsys, ["tagger", "--backend", "jax", "--out", out], "already imported", "tensorflow")
    _refused(capsys, ["tagger", "--backend", "torch", "--out", out], "--backend", "torch")
    _refused(capsys, ["tagger", "--device", "tpu", "--out", out], "--device", "tpu")
    _refused(capsys, ["tagger", "--mixed-precision", "fp8", "--out", out], "fp8")
    assert not os.path.exists(out)


# A fresh process in which the `jax` package cannot be found (find_spec is what
# train.cli asks), as on an install without the `jax` extra.
_WITHOUT_JAX = (
    "import importlib.util as u, sys\n"
    "real = u.find_spec\n"
    "u.find_spec = lambda name, *a: None if name.split('.')[0] == 'jax' else real(name, *a)\n"
    "from train.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_backend_not_installed_is_refused_not_replaced(tmp_path, how):
    """--backend jax (or KERAS_BACKEND=jax) without JAX installed: exit 2 and one line
    naming the missing package and the extra to install; nothing trains on another
    backend and nothing is written."""
    out = tmp_path / "run"
    argv = ["tagger", "--out", str(out)] + (["--backend", "jax"] if how == "flag" else [])
    env = _env("jax" if how == "environment" else "tensorflow")
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JAX, *argv],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, lines
    where = "--backend jax" if how == "flag" else "KERAS_BACKEND jax"
    assert where in lines[0] and "jax is not installed" in lines[0], lines
    assert ".[jax]" in lines[0], lines
    assert not out.exists()


@pytest.mark.slow
def test_data_parallel_on_two_devices_trains_as_one_device(jax_runs):
    """--strategy mirrored under JAX: keras.distribution.DataParallel over two host
    devices (XLA_FLAGS) gives the one-device run's losses and accuracies (the module's
    one-epoch seq2seq run under JAX, trained in the same child on one of them)."""
    histories = []
    for name, devices in (("seq2seq", 1), ("two", 2)):
        run, _, stderr = jax_runs[name]
        assert f"backend jax, {devices} x cpu" in stderr, stderr[-2000:]
        histories.append(checkpoint.latest(os.path.join(run, "checkpoints"))[1]["state"]["history"])
        with open(os.path.join(run, "metrics.json")) as f:
            runtime = json.load(f)["runtime"]
        assert runtime["devices"] == devices, runtime
    one, two = histories
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "acc", "val_loss", "val_acc"):
            assert abs(a[key] - b[key]) < 1e-4, (key, one, two)


@pytest.mark.slow
def test_jax_throughput_benchmark_smoke_runs_without_tensorflow(tmp_path):
    prefix = str(tmp_path / "smoke")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_throughput_jax", "--smoke", "--out", prefix],
        cwd=paths.ROOT,
        env=_env("jax"),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(prefix + ".json") as f:
        rows = json.load(f)["rows"]
    assert [r["model"] for r in rows] == ["tagger", "seq2seq", "sagan"]
    assert all(r["value"] > 0 for r in rows)


@pytest.mark.slow
def test_resume_under_jax_ends_where_the_uninterrupted_run_ends(jax_runs):
    """One epoch, then --resume to two, under JAX: the same losses and accuracies per
    epoch as two epochs in one go (checkpoints, optimizer state and batch order restored).
    The one epoch is a copy of the module's one-epoch seq2seq run under JAX; the resume
    reads only its files (the train child runs the three commands in turn)."""

    def history(name):
        run, _, stderr = jax_runs[name]
        return checkpoint.latest(os.path.join(run, "checkpoints"))[1]["state"]["history"], stderr

    (whole, _), (resumed, stderr) = history("whole"), history("resumed")
    assert "resuming" in stderr, stderr[-2000:]
    assert len(whole) == len(resumed) == 2
    for a, b in zip(whole, resumed):
        for key in ("loss", "acc", "val_loss", "val_acc"):
            assert abs(a[key] - b[key]) < 1e-5, (key, whole, resumed)
