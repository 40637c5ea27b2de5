"""Training the tagger: a tiny run that learns, resume, the run-directory contract, the CLIs."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support import paths, tiny
from train import checkpoint
from train.strategy import RunContext
from train.tagger import embedded
from train.tagger.training import resume_run, train_one
from zoo.rundir import load_json as read_json

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

ROOT = pathlib.Path(paths.ROOT)
FIXTURES = ROOT / "tests" / "fixtures" / "tagger"
TINY = tiny.TAGGER_MODEL


def _state(run):
    """The run's state as its newest step checkpoint records it."""
    return checkpoint.latest(run / "checkpoints")[1]["state"]


def make_args(**overrides):
    """The tagger's config object (what the command parses) with the tiny model."""
    from train.tagger import TaggerConfig

    options = [f"{k}={json.dumps(v)}" for k, v in TINY.items()]
    settings = dict(epochs=4, batch_size=16, max_minutes=0.0, verbose="0", model_option=options)
    return TaggerConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def tiny_data():
    return embedded.generate(seed=0, train_size=500, dev_size=80, test_size=150)


def test_attention_learns_context_that_fc_cannot(tmp_path, tiny_data, capsys):
    results = {}
    for arch in ("fc", "attention"):
        out = tmp_path / arch
        train_one(RunContext(), make_args(epochs=5, learning_rate=3e-3), tiny_data, arch, str(out))
        results[arch] = read_json(out / "metrics.json")
        history = _state(out)["history"]
        assert history[-1]["loss"] < 0.7 * history[0]["loss"], history
    fc, att = results["fc"], results["attention"]
    assert att["test_accuracy"] > fc["test_accuracy"]
    assert att["test_ambiguous_accuracy"] > fc["test_ambiguous_accuracy"] + 0.05
    assert "test acc" in capsys.readouterr().out  # the summary table


def test_resume_continues_epochs_and_optimizer_state(tmp_path, tiny_data, monkeypatch):
    out = tmp_path / "run"
    train_one(RunContext(), make_args(epochs=1), tiny_data, "fc", str(out))
    steps = _state(out)["step"]
    assert steps > 0
    # resume_run re-reads the data from config.json; give it the same small data there.
    config = read_json(out / "config.json")
    assert config["kind"] == "tagger" and config["train"]["epochs"] == 1
    monkeypatch.setattr("train.tagger.training.load_data", lambda cfg: tiny_data)
    resume_run(RunContext(), make_args(epochs=2, out=str(out), resume=True))
    path, record, _ = checkpoint.latest(out / "checkpoints")
    state = record["state"]
    assert state["epoch"] == 2 and [h["epoch"] for h in state["history"]] == [1, 2]
    assert state["step"] == 2 * steps
    with np.load(path) as saved:  # the optimizer's own count, restored and continued
        assert int(saved["optimizer/iteration"]) == 2 * steps


@pytest.mark.parametrize("warmup", [0, 30])
def test_warmup_cosine_is_kerass_cosine_decay_along_the_steps(warmup):
    from train.engine import At, warmup_cosine

    peak, total, alpha = 2e-3, 300, 0.05
    want = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else peak,
        total - warmup,
        alpha=alpha,
        warmup_target=peak if warmup else None,
        warmup_steps=warmup,
    )
    rate = warmup_cosine(peak, warmup, total, alpha)
    for step in (0, 1, 15, 29, 30, 31, 100, 299, 300, 400):
        got = rate(At(step, step / total))
        np.testing.assert_allclose(got, float(want(step)), rtol=1e-5, atol=1e-10)
    # A time budget further along than the steps decays further: its end is the floor.
    assert rate(At(100, 0.9)) < rate(At(100, 100 / total))
    assert rate(At(100, 1.0)) == pytest.approx(alpha * peak)


def run_cli(*args, module="train", timeout=300):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cli_run(shared_runs):
    """The pages' `python -m train tagger` run with the tiny flags (shared, read-only)."""
    return pathlib.Path(shared_runs.command("train", tiny.PAGE_RUNS["tagger"]))


def test_cli_writes_the_run_directory_contract(cli_run):
    out = cli_run
    config = read_json(out / "config.json")
    assert config["kind"] == "tagger" and config["model"]["arch"] == "attention"
    metrics = read_json(out / "metrics.json")
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert metrics["test_tokens"] > 0 and metrics["test_unseen_tokens"] > 0
    words = (out / "vocab" / "words.txt").read_text().splitlines()
    tags = (out / "vocab" / "tags.txt").read_text().splitlines()
    assert words[:2] == ["<pad>", "<unk>"]
    calib = np.load(out / "calibration.npz")
    assert set(calib.files) == {"word_ids", "char_ids", "tag_ids"}
    gold = calib["tag_ids"]
    assert gold.shape == calib["word_ids"].shape
    assert np.array_equal(gold >= 0, calib["word_ids"] > 0)  # -1 exactly on padding
    assert gold.max() < len(tags)
    assert calib["word_ids"].shape[0] == 200 and calib["word_ids"].dtype == np.int32
    assert calib["char_ids"].shape[:2] == calib["word_ids"].shape
    assert (out / "attention.png").stat().st_size > 1000
    # The held-out rows are the whole (small) test split: the model's accuracy on
    # them is the run's test accuracy.
    held = np.load(out / "evaluation.npz")
    assert set(held.files) == {"word_ids", "char_ids", "tag_ids"}
    probs = keras.models.load_model(out / "model.keras").core(
        {"word_ids": held["word_ids"], "char_ids": held["char_ids"]}
    )
    real = held["tag_ids"] >= 0
    assert int(real.sum()) == metrics["test_tokens"]
    accuracy = float((np.argmax(probs, -1)[real] == held["tag_ids"][real]).mean())
    assert abs(accuracy - metrics["test_accuracy"]) < 1e-6
    assert checkpoint.latest(out / "checkpoints")[1]["state"]["epoch"] == metrics["epochs"]
    assert any((out / "logs").rglob("events.out.tfevents.*"))
    model = keras.models.load_model(out / "model.keras")
    assert list(model.tags) == tags and list(model.words) == words
    pairs = model.tag("I saw a saw")[0]
    assert [w for w, _ in pairs] == ["I", "saw", "a", "saw"]


def test_tag_command_prints_word_tag_pairs(cli_run, capsys):
    from zoo.tag import main

    assert main([str(cli_run), "I saw a saw", "They watch the watch ."]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert [p.rsplit("/", 1)[0] for p in lines[0].split()] == ["I", "saw", "a", "saw"]
    tags = (cli_run / "vocab" / "tags.txt").read_text().split()
    assert all(p.rsplit("/", 1)[1] in tags for p in lines[1].split())


def test_tag_command_runs_an_exported_tflite_model(cli_run, tmp_path):
    if not (ROOT / "export" / "__main__.py").exists():
        pytest.skip("export package not present")
    from export.__main__ import main as export_main

    tflite = tmp_path / "tagger.tflite"
    assert export_main(["tflite", str(cli_run), "--out", str(tflite)]) == 0
    sentences = ["I saw a saw", "the old saw"]
    # `python -m zoo.tag` as a user runs it, in its own process.
    lite_tags = run_cli(str(tflite), *sentences, module="zoo.tag")
    assert lite_tags.returncode == 0, lite_tags.stderr
    model = keras.models.load_model(cli_run / "model.keras")
    expected = [" ".join(f"{w}/{t}" for w, t in pairs) for pairs in model.tag(sentences)]
    assert lite_tags.stdout.strip().splitlines() == expected


def _assert_one_line_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--arch", "cnn"], ["unknown arch", "'cnn'"]),
        (["--epochs", "-1"], ["--epochs", "-1"]),
        (["--batch-size", "0"], ["--batch-size", "0"]),
        (["--train-file", "/nonexistent/train.conllu"], ["not found", "/nonexistent/train.conllu"]),
        (["--train-file", str(FIXTURES / "malformed.conllu")], ["malformed.conllu:9"]),
        (["--train-file", str(FIXTURES / "empty.conllu")], ["empty data set", "empty.conllu"]),
        (
            ["--dataset", "tfds:no_such_dataset_xyz"],
            ["unknown tfds data set", "no_such_dataset_xyz"],
        ),
        (["--dataset", "en_ewt"], ["tfds:NAME", "en_ewt"]),
        (["--bogus-flag"], ["--bogus-flag"]),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needles):
    out = tmp_path / "out"
    result = run_cli("tagger", "--out", str(out), *args)
    _assert_one_line_error(result, *needles)
    assert not out.exists()


def test_cli_never_writes_into_a_foreign_or_finished_directory(tmp_path, cli_run):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    _assert_one_line_error(
        run_cli("tagger", "--out", str(foreign)), "not a run directory", str(foreign)
    )
    assert os.listdir(foreign) == ["notes.txt"] and (foreign / "notes.txt").read_text() == "keep me"
    out = cli_run
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    _assert_one_line_error(run_cli("tagger", "--out", str(out)), "already holds a run", "--resume")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    _assert_one_line_error(run_cli("nonsense"), "unknown model", "'nonsense'")
