"""Shared builders for the tests (tiny models, run directories, child environments).

Kept in a test_ module so no conftest is needed; it defines no tests itself.
"""

import json
import os
import subprocess
import sys

import numpy as np

WORDS = ["<pad>", "<unk>", "i", "saw", "a", "the", "dog", "cat", "can", "book"]
TAGS = ["PRON", "VERB", "DET", "NOUN", "AUX"]
SENTENCES = [["I", "saw", "a", "saw"], ["the", "dog", "can", "book", "a", "cat"], ["I", "book"]]

CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
CLEAN_ENV.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def training_env(tf_config=None):
    """The environment of a `python -m train ...` child under TensorFlow: fixed hash
    seed, quiet logs, and no TF_CONFIG but `tf_config` (a dict) when given, so a
    multi-worker test's cluster never leaks into a single-process run."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def make_tagger(arch="attention", max_len=16):
    import zoo

    chars = ["<pad>", "<unk>"] + sorted(set("".join(WORDS[2:]) + "ISTDCB"))
    return zoo.build(
        "tagger",
        words=WORDS,
        chars=chars,
        tags=TAGS,
        arch=arch,
        max_chars=8,
        max_len=max_len,
        word_dim=16,
        char_dim=8,
        char_filters=8,
        hidden_dim=16,
        num_heads=2,
    )


def make_tagger_run(path, arch="attention", rows=60):
    """A run directory (as training writes it) holding an untrained tiny tagger."""
    from zoo.tagger.model import pad_tokens

    os.makedirs(path, exist_ok=True)
    model = make_tagger(arch)
    sents = (SENTENCES * rows)[:rows]
    ids = model.encode_tf(pad_tokens(sents))
    rng = np.random.default_rng(0)
    gold = rng.integers(0, len(TAGS), size=np.asarray(ids["word_ids"]).shape)
    gold[np.asarray(ids["word_ids"]) == 0] = -1
    model.save(os.path.join(path, "model.keras"))
    np.savez(
        os.path.join(path, "calibration.npz"),
        word_ids=np.asarray(ids["word_ids"]),
        char_ids=np.asarray(ids["char_ids"]),
        tag_ids=gold,
    )
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"kind": "tagger", "model": {"arch": arch}, "train": {}}, f)
    with open(os.path.join(path, "metrics.json"), "w") as f:
        json.dump({"test_accuracy": 0.0}, f)
    return model


def make_dense_model(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((8,), name="features")
    x = keras.layers.Dense(32, activation="relu", name="hidden")(inp)
    out = keras.layers.Dense(4, activation="softmax", name="probs")(x)
    return keras.Model(inp, out)


def run_clean(script, *args, timeout=300):
    """Runs `script` in a fresh interpreter that cannot see the project (-I, cwd=/)."""
    return subprocess.run(
        [sys.executable, "-I", "-c", script, *args],
        cwd="/",
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
