"""`zoo.lite`: the TFLite exports run with ai-edge-litert, NumPy and sentencepiece
only, in a process where importing TensorFlow, Keras or tensorflow_text fails,
and answer what the Keras models answer in this process: the same tags, the same
greedy and beam-search tokens, images equal up to float rounding (#17)."""

import json
import os

import numpy as np
import pytest

import zoo
import zoo.models  # noqa: F401
from export.kinds import seq2seq as seq2seq_kind
from export.tflite import export_tflite
from tests.export.test_stock_serving import text_seq2seq_model
from tests.support.runs import make_tagger_run, run_clean
from zoo.seq2seq import decoding

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

TEXTS = ["a man in the snow", "deux chiens jouent", "ｆｕｌｌｗｉｄｔｈ dogs", "x"]
WORDS = ["I saw a saw", "the dog can book a cat 42", "They SAW 7 Dogs"]

_CHILD = r"""
import importlib.abc, json, sys

BLOCKED = ("tensorflow", "keras", "tensorflow_text", "tf_keras", "jax")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: zoo.lite must not need it")

sys.meta_path.insert(0, Block())
for name in BLOCKED:
    try:
        __import__(name)
        raise SystemExit(f"the block of {name} failed")
    except ImportError:
        pass
import zoo.lite
import zoo.litert

paths, sentences, texts = json.loads(sys.argv[1])
out = {}
tagger = zoo.lite.load(paths["tagger"])
out["tags"] = tagger.tag(sentences)
for key in ("steps_dir", "steps_file", "greedy_file"):
    translator = zoo.lite.load(paths[key])
    out[key] = {"greedy": [translator.translate(text) for text in texts]}
    if key != "greedy_file":
        out[key]["beam"] = [translator.translate(text, beam_width=3) for text in texts]
# The one decoder of the step signatures (zoo.litert.StepModel), on ids.
from zoo.seq2seq.tokenization import Tokenizer
steps = zoo.litert.StepModel.from_interpreter(zoo.litert.interpreter(paths["steps_file"]))
with open(paths["spm"], "rb") as f:
    ids = Tokenizer(f.read()).encode(texts)
out["ids"] = [steps.decode_ids([row])[0] for row in ids]
out["beam_ids"] = [steps.decode_ids([row], beam_width=3)[0] for row in ids]
generator = zoo.lite.load(paths["sagan"])
out["images"] = generator.generate([0, 2, 1], seed=7).tolist()
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "keras", "tensorflow_text",
                                                          "layers", "export", "train"})
assert not loaded, loaded
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    import keras

    base = tmp_path_factory.mktemp("lite")
    keras.utils.set_random_seed(1)
    run = str(base / "tagger-run")
    make_tagger_run(run)
    export_tflite(run, str(base / "tagger.tflite"))
    translator = text_seq2seq_model()
    keras_file = str(base / "s2s.keras")
    translator.save(keras_file)
    seq2seq_kind.export_all(keras_file, str(base / "s2s"))
    generator = zoo.build(
        "sagan_generator", image_size=32, channels=1, num_classes=3, latent_dim=8, width=4
    )
    export_tflite(generator, str(base / "sagan.tflite"))
    paths = {
        "tagger": str(base / "tagger.tflite"),
        "steps_dir": str(base / "s2s"),
        "steps_file": str(base / "s2s" / "steps.tflite"),
        "greedy_file": str(base / "s2s" / "greedy.tflite"),
        "sagan": str(base / "sagan.tflite"),
        "spm": str(base / "s2s" / "spm.model"),
    }
    result = run_clean(_CHILD, json.dumps([paths, WORDS, TEXTS]))
    assert result.returncode == 0, result.stderr[-3000:]
    return {
        "run": run,
        "translator": translator,
        "generator": generator,
        "dir": str(base),
        "got": json.loads(result.stdout.strip().splitlines()[-1]),
    }


def test_export_folder_ships_the_sentencepiece_model(exports):
    with open(os.path.join(exports["dir"], "s2s", "spm.model"), "rb") as f:
        assert f.read() == exports["translator"].tokenizer.proto


def test_tags_equal_keras(exports):
    want = zoo.load(exports["run"]).tag(WORDS)
    assert [[list(pair) for pair in row] for row in want] == exports["got"]["tags"]


def test_greedy_and_beam_equal_keras(exports):
    model = exports["translator"]
    ids = model.tokenizer.encode(TEXTS)
    greedy = [model.translate([text])[0] for text in TEXTS]
    greedy_ids = [decoding.decode_ids(model, [row])[0] for row in ids]
    beam = [model.translate([text], beam_width=3)[0] for text in TEXTS]
    beam_ids = [decoding.decode_ids(model, [row], beam_width=3)[0] for row in ids]
    assert any(len(row) > 2 for row in greedy_ids)  # not a vacuous comparison
    assert greedy_ids != beam_ids or greedy == beam
    assert exports["got"]["ids"] == greedy_ids
    assert exports["got"]["beam_ids"] == beam_ids
    for key in ("steps_dir", "steps_file", "greedy_file"):
        assert exports["got"][key]["greedy"] == greedy, key
    for key in ("steps_dir", "steps_file"):
        assert exports["got"][key]["beam"] == beam, key


def test_generated_images_equal_keras(exports):
    generator = exports["generator"]
    labels = np.array([0, 2, 1], np.int32)
    noise = np.random.default_rng(7).standard_normal((3, 8)).astype(np.float32)
    want = np.clip(
        np.asarray(generator({"noise": noise, "label": labels}, training=False)) * 0.5 + 0.5, 0, 1
    )
    got = np.asarray(exports["got"]["images"], np.float32)
    assert got.shape == want.shape and want.std() > 0
    np.testing.assert_allclose(got, want, atol=1e-4)
