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

from train.cli import main as train_main

TAGGER = ["--epochs", "1", "--model-option=word_dim=16", "--model-option=char_dim=8",
          "--model-option=char_filters=16", "--model-option=hidden_dim=32",
          "--model-option=num_heads=2", "--model-option=num_layers=1"]
SEQ2SEQ = ["--task", "copy", "--task-length", "5", "--train-size", "64", "--epochs", "1",
           "--hidden-dim", "16", "--intermediate-dim", "32", "--dev-sample", "0",
           "--verbose", "0", "--max-minutes", "0"]
SAGAN = ["--epochs", "1", "--train-size", "64", "--test-size", "32", "--eval-samples", "32",
         "--epoch-eval-samples", "32", "--classifier-epochs", "1", "--width", "8",
         "--latent-dim", "16", "--seed", "1"]
KINDS = {"tagger": TAGGER, "seq2seq": SEQ2SEQ, "universal_transformer": SEQ2SEQ, "sagan": SAGAN}

SENTENCES = ["I saw a saw", "they can can the fish"]
TEXTS = ["abcde", "jjab"]

# Run in a fresh isolated process: no PYTHONPATH, no current directory on sys.path,
# so `zoo` comes from the installed package and nothing of `train` is imported.
CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import zoo
    import keras

    kind, run, out = sys.argv[1:4]
    model = keras.models.load_model(run + "/model.keras")
    assert "train" not in sys.modules, "loading imported the training package"
    result = {"class": type(model).__name__, "compiled": bool(model.compiled),
              "optimizer": type(model.optimizer).__name__ if model.compiled else None}
    arrays = {}
    if kind == "tagger":
        arrays["keras"] = np.asarray(model.predict_ids(zoo.tagger.pad_tokens(
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
    np.savez(out + ".npz", **arrays)
    with open(out + ".json", "w") as f:
        json.dump(result, f)
""") % {"sentences": SENTENCES, "texts": TEXTS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("library")
    out = {}
    for kind, flags in KINDS.items():
        out[kind] = str(base / kind)
        assert train_main([kind, "--out", out[kind], *flags]) == 0
    return out


def _expected(kind, run):
    """What the training process's own loader (`compile=False`) computes."""
    from zoo import model_file
    from zoo.tagger import pad_tokens

    model = model_file.load(os.path.join(run, "model.keras"))
    if kind == "tagger":
        return {"keras": np.asarray(model.predict_ids(pad_tokens([s.split() for s in SENTENCES])))}
    if kind == "sagan":
        rng = np.random.default_rng(0)
        feed = {"noise": rng.standard_normal((3, model.input["noise"].shape[-1])).astype("float32"),
                "label": np.array([0, 1, 2], "int32")}
        return {"keras": np.asarray(model(feed, training=False))}
    return {"translations": model.translate(TEXTS)}


def test_every_kind_loads_in_a_fresh_process_with_default_arguments(runs, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    procs = {}
    for kind, run in runs.items():
        out = str(tmp_path / kind)
        procs[kind] = (out, subprocess.Popen([sys.executable, "-I", "-c", CHILD, kind, run, out],
                                             cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True))
    for kind, (out, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{kind}: {err[-2000:]}"
        with open(out + ".json") as f:
            result = json.load(f)
        expected = _expected(kind, runs[kind])
        if kind == "sagan":
            assert result["class"] == "Functional"
        else:
            # Trained models keep their compile state, optimizer and schedule included.
            assert result["compiled"] and result["optimizer"] in ("Adam", "AdamW"), result
        if kind in ("seq2seq", "universal_transformer"):
            assert result["schedule"] == "WarmupInverseSqrt"
            assert result["keras"] == expected["translations"]
        else:
            with np.load(out + ".npz") as got:
                np.testing.assert_allclose(got["keras"], expected["keras"], rtol=0, atol=1e-5)
