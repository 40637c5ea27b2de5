"""`.keras` files saved before the per-model package move (#22) still load and give the
outputs they gave when saved (tests/fixtures/saved_before_move/make.py wrote them)."""

import os

import keras
import numpy as np
import pytest

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

HERE = os.path.join(FIXTURES, "saved_before_move")
OUTPUTS = np.load(os.path.join(HERE, "outputs.npz"))


def _load(name):
    return keras.models.load_model(os.path.join(HERE, f"{name}.keras"))


def test_tagger_loads_and_tags_as_before():
    tagger = _load("tagger")
    tags = np.array(tagger.tag([["I", "saw", "a", "saw"]])[0], dtype=object).astype(str)
    np.testing.assert_array_equal(tags, OUTPUTS["tagger_tags"])


@pytest.mark.parametrize("kind", ["seq2seq", "universal_transformer"])
def test_seq2seq_loads_and_computes_as_before(kind):
    model = _load(kind)
    logits = model(
        {"source_ids": OUTPUTS[f"{kind}_source"], "target_ids": OUTPUTS[f"{kind}_target"]}
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(logits), OUTPUTS[f"{kind}_logits"], atol=1e-5
    )


def test_sagan_generator_loads_and_draws_as_before():
    g = _load("sagan_generator")
    images = g({"noise": OUTPUTS["sagan_z"], "label": OUTPUTS["sagan_c"]}, training=False)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(images), OUTPUTS["sagan_images"], atol=1e-5
    )
