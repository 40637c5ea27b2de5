"""The library contract of a run directory, checked in fresh `python -I` processes:
`import zoo; keras.models.load_model("RUN/model.keras")` with default arguments, and
`zoo.load(RUN)`, load every model kind that `python -m train` writes, and compute what
the training process computed."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.support import tiny
from tests.support.paths import ROOT
from train.cli import main as train_main

# `python -m train KIND` of each kind: the pages' own runs (docs/*.md with the tiny
# flags, shared with tests/test_docs.py and others through tests/support/shared_runs.py)
# and a tiny universal transformer on the copy task.
KINDS = {
    **tiny.PAGE_RUNS,
    "universal_transformer": [
        "universal_transformer",
        "--task",
        "copy",
        "--out",
        "runs/ut",
        *tiny.SEQ2SEQ,
    ],
}

SENTENCES = ["I saw a saw", "they can can the fish"]
TEXTS = ["abcde", "jjab"]

# Run in a fresh isolated process: no PYTHONPATH, no current directory on sys.path,
# so `zoo` comes from the installed package and nothing of `train` is imported.
CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import zoo.models  # noqa: F401  (registers every class zoo model files name)
    import keras

    def load(kind, run, out):
        model = keras.models.load_model(run + "/model.keras")
        assert "train" not in sys.modules, "loading imported the training package"
        result = {"class": type(model).__name__, "compiled": bool(model.compiled),
                  "optimizer": type(model.optimizer).__name__ if model.compiled else None}
        arrays = {}
        if kind == "tagger":
            arrays["keras"] = np.asarray(model.predict_ids(zoo.tagger.model.pad_tokens(
                [s.split() for s in %(sentences)r])))
        elif kind == "sagan":
            rng = np.random.default_rng(0)
            feed = {"noise": rng.standard_normal((3, model.input["noise"].shape[-1])).astype("float32"),
                    "label": np.array([0, 1, 2], "int32")}
            arrays["keras"] = np.asarray(model(feed, training=False))
        else:
            result["keras"] = model.translate(%(texts)r)
            schedule = model.optimizer._learning_rate
            result["schedule"] = type(schedule).__name__
        task = zoo.load(run)
        assert not {m.split(".")[0] for m in sys.modules} & {"train", "export"}
        result["task"] = [type(task).__name__, task.kind, task.format]
        if kind == "tagger":
            result["tagged"] = task.tag(%(sentences)r)
        elif kind == "sagan":
            arrays["task"] = task.generate([0, 1, 2], seed=5)
        else:
            result["generated"] = task.generate(%(texts)r)
            result["beam"] = task.generate(%(texts)r, sampler="beam", num_return_sequences=2,
                                           return_scores=True)
        np.savez(out + ".npz", **arrays)
        with open(out + ".json", "w") as f:
            json.dump(result, f)

    for kind, run, out in json.loads(sys.argv[1]):
        load(kind, run, out)
""") % {"sentences": SENTENCES, "texts": TEXTS}


@pytest.fixture(scope="module")
def runs(shared_runs):
    """{kind: run directory} (shared, read-only)."""
    return {kind: shared_runs.command("train", argv) for kind, argv in KINDS.items()}


def _expected(kind, run):
    """What the training process's own loader (`compile=False`) computes."""
    from zoo import model_file
    from zoo.tagger.model import pad_tokens

    model = model_file.load(os.path.join(run, "model.keras"))
    if kind == "tagger":
        return {
            "keras": np.asarray(model.predict_ids(pad_tokens([s.split() for s in SENTENCES]))),
            "tagged": [[list(p) for p in s] for s in model.tag(SENTENCES)],
        }
    if kind == "sagan":
        rng = np.random.default_rng(0)
        feed = {
            "noise": rng.standard_normal((3, model.input["noise"].shape[-1])).astype("float32"),
            "label": np.array([0, 1, 2], "int32"),
        }
        # zoo.load's generator: the noise of `python -m zoo.generate --seed 5`, tanh -> [0, 1].
        noise = (
            np.random.default_rng(5).standard_normal((3, feed["noise"].shape[1])).astype("float32")
        )
        task = model({"noise": noise, "label": feed["label"]}, training=False)
        return {
            "keras": np.asarray(model(feed, training=False)),
            "task": (np.asarray(task) + 1) / 2,
        }
    return {
        "translations": model.translate(TEXTS),
        "beam": model.generate(TEXTS, sampler="beam", num_return_sequences=2, return_scores=True),
    }


@pytest.mark.slow
def test_every_kind_loads_in_a_fresh_process_with_default_arguments(runs, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # One fresh process loads every kind in turn, having imported only zoo.models and
    # keras, as a user's script does (one TensorFlow start-up, not four).
    jobs = [(kind, run, str(tmp_path / kind)) for kind, run in runs.items()]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, json.dumps(jobs)],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for kind, _, out in jobs:
        with open(out + ".json") as f:
            result = json.load(f)
        expected = _expected(kind, runs[kind])
        if kind == "sagan":
            assert result["class"] == "Functional"
        else:
            # Trained models keep their compile state, optimizer and schedule included.
            assert result["compiled"] and result["optimizer"] in ("Adam", "AdamW"), result
        assert result["task"] == [
            {"tagger": "TaggerTask", "sagan": "ImageGenerator"}.get(kind, "Translator"),
            kind,
            "keras",
        ]
        if kind in ("seq2seq", "universal_transformer"):
            with open(os.path.join(runs[kind], "config.json")) as f:
                schedule = json.load(f)["train"]["schedule"]
            # The cosine follows the budget's progress: the step sets the optimizer's rate.
            names = {"inverse_sqrt": "WarmupInverseSqrt", "cosine": "Variable"}
            assert result["schedule"] == names[schedule], (schedule, result["schedule"])
            assert result["keras"] == result["generated"] == expected["translations"]
            beam = [[[text, score] for text, score in row] for row in expected["beam"]]
            assert [[c[0] for c in row] for row in result["beam"]] == [
                [c[0] for c in row] for row in beam
            ]
            np.testing.assert_allclose(
                [[c[1] for c in row] for row in result["beam"]],
                [[c[1] for c in row] for row in beam],
                atol=1e-5,
            )
        else:
            with np.load(out + ".npz") as got:
                np.testing.assert_allclose(got["keras"], expected["keras"], rtol=0, atol=1e-5)
                if kind == "sagan":
                    np.testing.assert_allclose(got["task"], expected["task"], rtol=0, atol=1e-5)
            if kind == "tagger":
                assert result["tagged"] == expected["tagged"]


@pytest.mark.slow
def test_zoo_load_runs_the_sagan_exports_like_the_run(runs, shared_runs):
    """A SavedModel and a batch-1 `.tflite` of the generator, loaded with
    `zoo.load`, give the run's images for the same class ids and seed. The exports are
    docs/sagan.md's two commands (`python -m export ...`, exit 0), shared with
    tests/test_docs.py."""
    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    run = runs["sagan"]
    want = zoo.load(run).generate([3, 0, 1], seed=2)
    assert want.shape == (3, 32, 32, 3) and 0 <= want.min() and want.max() <= 1
    saved = shared_runs.command("export", ["savedmodel", run, "--out", "serving/sagan"])
    lite = shared_runs.command("export", ["tflite", run, "--out", "g.tflite", "--static-shape"])
    for path, fmt in ((saved, "savedmodel"), (lite, "tflite")):
        task = zoo.load(path)
        assert (task.kind, task.format, task.conditional) == ("sagan", fmt, True)
        np.testing.assert_allclose(task.generate([3, 0, 1], seed=2), want, rtol=0, atol=1e-4)
    task = zoo.load(lite)
    names = task.class_names
    np.testing.assert_allclose(
        task.generate([names[3], names[0]], seed=2), want[:2], rtol=0, atol=1e-4
    )
    with pytest.raises(ValueError, match="class_ids"):
        task.generate([4])
    with pytest.raises(ValueError, match="class_ids"):
        task.generate(None, num_images=2)


def test_zoo_load_refuses_what_it_cannot_load(tmp_path):
    """Not slow: a run directory as training writes it (an untrained tiny tagger) is
    enough here, so `make test-fast` does not wait for the module's four trained runs."""
    import zoo.models  # noqa: F401  (registers every class zoo model files name)
    from tests.support.runs import make_tagger_run

    run = tmp_path / "run"
    make_tagger_run(str(run))

    with pytest.raises(ValueError, match="does not exist"):
        zoo.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="without model.keras or saved_model.pb"):
        zoo.load(tmp_path)
    (tmp_path / "x.tflite").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="sidecar"):
        zoo.load(tmp_path / "x.tflite")
    (tmp_path / "x.keras").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a .keras model file"):
        zoo.load(tmp_path / "x.keras")
    with pytest.raises(ValueError, match="must be a run directory"):
        zoo.load(os.path.join(run, "config.json"))


def _parser(kind):
    from train import cli

    return cli.build_parser(kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_config_flags_parse_back_to_the_recorded_options(runs, kind):
    from train import cli

    config = cli.read_config(runs[kind], kind)
    parser = _parser(kind)
    args = vars(parser.parse_args(cli.config_argv(config)))
    recorded = {
        k: v for k, v in config["train"].items() if k in args and k not in ("out", "resume")
    }
    assert recorded and {k: args[k] for k in recorded} == recorded
    if kind == "tagger":  # hyper-parameters travel as --model-option
        options = dict(item.split("=", 1) for item in args["model_option"])
        assert json.loads(options["hidden_dim"]) == config["model"]["hidden_dim"] == 32
        assert args["arch"] == config["model"]["arch"]


@pytest.mark.slow
def test_config_replays_a_tagger_run(runs, tmp_path, capsys):
    out = str(tmp_path / "replay")
    # A later flag overrides the file.
    assert (
        train_main(
            [
                "tagger",
                "--config",
                os.path.join(runs["tagger"], "config.json"),
                "--out",
                out,
                "--batch-size",
                "256",
            ]
        )
        == 0
    )
    with open(os.path.join(runs["tagger"], "config.json")) as f:
        original = json.load(f)
    with open(os.path.join(out, "config.json")) as f:
        replayed = json.load(f)
    assert replayed["model"] == original["model"]
    assert replayed["train"] == {**original["train"], "batch_size": 256}
    capsys.readouterr()
    assert train_main(["seq2seq", "--config", runs["tagger"], "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a 'tagger' run, not 'seq2seq'" in err[0]
    assert train_main(["tagger", "--config", str(tmp_path / "none.json")]) == 2
    assert "--config: file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_dispatches_to_each_cli(runs, capsys):
    from zoo import console

    assert console.main(["--help"]) == 0
    assert "attention-zoo COMMAND" in capsys.readouterr().out
    assert console.main(["tag", runs["tagger"], "I saw a saw"]) == 0
    assert len(capsys.readouterr().out.split()) == 4
    assert console.main(["translate", runs["seq2seq"], "abcde"]) == 0
    capsys.readouterr()
    assert console.main(["nope"]) == 2 and "unknown command" in capsys.readouterr().err
    assert console.main(["train", "nope"]) == 2
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'attention-zoo = "zoo.console:main"' in f.read()
