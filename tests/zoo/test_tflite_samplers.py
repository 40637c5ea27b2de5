"""`zoo.load("steps.tflite").generate(...)` runs every sampler on the exported
`encode` / `decode_step` signatures, and gives what the Keras model gives from the
run directory: the same tokens (greedy, beam n-best, seeded top-k / top-p draws)
and the same scores up to float rounding; so does a SavedModel through its
`encode` / `decode_step` signatures (the same functions). The greedy-only formats
(one-file `greedy.tflite`, a SavedModel without those signatures) refuse the other
samplers naming sampler and format."""

import os

import keras
import numpy as np
import pytest

import zoo
from export.savedmodel import export_savedmodel
from tests.support import tiny
from zoo.seq2seq import samplers

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

TEXTS = ["abcde", "jjab", "ba"]
# Greedy and beam search (n-best, length penalty, max_length), for every step format.
DECODE_CASES = [
    dict(sampler="greedy"),
    dict(sampler="greedy", return_scores=True),
    dict(sampler="beam", return_scores=True),
    dict(
        sampler=samplers.Beam(width=3, length_penalty=1.0),
        num_return_sequences=3,
        return_scores=True,
    ),
    dict(
        sampler=samplers.Beam(width=2, length_penalty=0.0),
        num_return_sequences=2,
        return_scores=True,
        max_length=4,
    ),
]


@pytest.fixture(scope="module")
def exported(shared_runs):
    """docs/deploy.md's run and exports (`python -m train seq2seq --task reverse` with
    the tiny flags, `python -m export savedmodel`, `python -m export.kinds.seq2seq`),
    shared with tests/test_docs.py and tests/zoo/test_library_load.py (read-only)."""
    run = shared_runs.command("train", tiny.PAGE_RUNS["seq2seq"])
    lite = shared_runs.command("export.kinds.seq2seq", [run, "--out", "mt-tflite"])
    saved = shared_runs.command("export", ["savedmodel", run, "--out", "serving/mt"])
    files = {
        "steps": os.path.join(lite, "steps.tflite"),
        "greedy": os.path.join(lite, "greedy.tflite"),
        "savedmodel": os.path.join(saved, "1"),
    }
    return run, files


@pytest.fixture(scope="module")
def keras_task(exported):
    """The run as `zoo.load(run)` gives it, loaded once: each load compiles its decoding
    loops again (seconds per sampler), and a seeded draw does not depend on history."""
    return zoo.load(exported[0])


def _texts(rows):
    return [[text for text, _ in row] for row in rows]


def _scores(rows):
    return np.array([[score for _, score in row] for row in rows])


def _check(got, want, case):
    if not case.get("return_scores"):
        assert got == want, case
        return
    assert _texts(got) == _texts(want), case
    np.testing.assert_allclose(_scores(got), _scores(want), rtol=0, atol=1e-4, err_msg=str(case))


def test_steps_tflite_decodes_what_keras_decodes(exported, keras_task):
    """Greedy and beam search (n-best, length penalty, max_length): the run's
    Keras model, decoding under XLA as `zoo.load(run)` does."""
    run, files = exported
    lite = zoo.load(files["steps"])
    assert (keras_task.format, lite.format, lite.kind) == ("keras", "tflite", "seq2seq")
    for case in DECODE_CASES:
        _check(lite.generate(TEXTS, **case), keras_task.generate(TEXTS, **case), case)
    # The untrained model's n-best lists are real alternatives, not copies of one string.
    best = lite.generate(
        TEXTS, sampler=samplers.Beam(width=3), num_return_sequences=3, return_scores=True
    )
    assert all(len({t for t, _ in row}) == 3 for row in best)
    assert all(np.all(np.diff(_scores([row])) <= 1e-6) for row in best)  # best first
    assert lite.generate(TEXTS[0], sampler="beam") == keras_task.generate(TEXTS[0], sampler="beam")


def test_steps_tflite_samples_what_keras_samples_with_the_same_seed(exported, keras_task):
    """Seeded top-k / top-p / temperature draws equal the run's (Keras under XLA:
    the noise is an integer hash, the same bits in both).

    Scores are compared on draws without a PAD token: the untrained model draws
    PAD (id 0), and Keras scores a draw with its full decoder, which masks PAD
    keys, while decoding (Keras's cached steps and the exported ones) attends to
    them."""
    from zoo import model_file
    from zoo.seq2seq import decoding
    from zoo.seq2seq.transformer import Seq2SeqTransformer

    run, files = exported
    lite = zoo.load(files["steps"])
    model = model_file.load(f"{run}/model.keras")
    assert isinstance(model, Seq2SeqTransformer)
    ids = model.tokenizer.encode(TEXTS)
    compared = 0
    for sampler, seed in (
        (samplers.TopK(5), 7),
        (samplers.Sampling(temperature=1.5, top_p=0.9), 11),
        (samplers.Sampling(), 3),
    ):
        want = decoding.generate_ids(model, ids, sampler, num_return_sequences=4, seed=seed)
        got = lite._generate_ids(ids, sampler, 4, seed=seed)  # StepModel.generate_ids
        assert [[t for t, _ in row] for row in got] == [[t for t, _ in row] for row in want], (
            sampler
        )
        for row_got, row_want in zip(got, want):
            for (tokens, score), (_, expected) in zip(row_got, row_want):
                if 0 not in tokens:
                    compared += 1
                    assert abs(score - expected) < 1e-4, (sampler, tokens, score, expected)
        case = dict(sampler=sampler, num_return_sequences=4, seed=seed)
        assert _texts(lite.generate(TEXTS, **case)) == _texts(keras_task.generate(TEXTS, **case))
    assert compared >= 6
    # Keras's own loop gives the same draws with and without XLA.
    source = keras.utils.pad_sequences(ids, padding="post")
    eager = decoding.sample(model, source, 7, top_k=5)
    xla = decoding.compiled(model, "sample", sampling=samplers.TopK(5))(source, np.int32(7))
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(xla))


def test_savedmodel_step_signatures_decode_and_sample_what_keras_does(exported, keras_task):
    """A SavedModel's `encode` / `decode_step` signatures, driven by the same
    adapter as steps.tflite's: beam n-best tokens and scores, and seeded top-k
    draws, equal the run's Keras model; it keeps its translate signatures."""
    import json
    import os

    import tensorflow as tf

    run, files = exported
    saved = zoo.load(files["savedmodel"])
    assert (saved.format, saved.kind) == ("savedmodel", "seq2seq")
    cases = DECODE_CASES + [
        dict(sampler=samplers.TopK(5), num_return_sequences=4, seed=7, return_scores=True),
        dict(
            sampler=samplers.Sampling(temperature=1.5, top_p=0.9),
            num_return_sequences=2,
            seed=11,
            return_scores=True,
        ),
    ]
    for case in cases:
        got, want = saved.generate(TEXTS, **case), keras_task.generate(TEXTS, **case)
        _check(got, want, case)
    best = saved.generate(
        TEXTS, sampler=samplers.Beam(width=3), num_return_sequences=3, return_scores=True
    )
    assert all(len({t for t, _ in row}) == 3 for row in best)
    # The signatures are steps.tflite's: same names, dtypes and shapes.
    from zoo.litert import interpreter

    lite = interpreter(files["steps"])
    loaded = tf.saved_model.load(files["savedmodel"])
    for name in ("encode", "decode_step"):
        runner, fn = lite.get_signature_runner(name), loaded.signatures[name]
        want_in = {
            k: (tuple(v["shape"]), v["dtype"]) for k, v in runner.get_input_details().items()
        }
        want_out = {
            k: (tuple(v["shape"]), v["dtype"]) for k, v in runner.get_output_details().items()
        }
        got_in, got_out = (
            {k: (tuple(v.shape), v.dtype.as_numpy_dtype) for k, v in specs.items()}
            for specs in (fn.structured_input_signature[1], fn.structured_outputs)
        )
        assert (got_in, got_out) == (want_in, want_out), name
    assert {"translate", "translate_ids", "serving_default"} <= set(loaded.signatures)
    # signature.json lists them; decode_step's example (KV caches) is too big for a REST body.
    with open(os.path.join(files["savedmodel"], "signature.json")) as f:
        doc = json.load(f)["signatures"]
    assert list(doc["decode_step"]["inputs"]) == [
        "token",
        "position",
        "cross_cache",
        "encoder_mask",
        "self_cache",
    ]
    assert doc["decode_step"]["example_request_inputs"] is None
    assert doc["encode"]["example_request_instances"]["instances"][0]["source_ids"]


def test_a_seeded_draw_repeats_and_the_seed_matters(exported):
    _, files = exported
    lite = zoo.load(files["steps"])
    draw = [
        lite.generate(
            TEXTS, sampler=samplers.TopK(8, temperature=2.0), num_return_sequences=3, seed=s
        )
        for s in (5, 5, 6)
    ]
    assert draw[0] == draw[1]
    assert draw[0] != draw[2]


def test_greedy_only_formats_name_the_sampler_and_the_format(
    exported, keras_task, tmp_path, monkeypatch
):
    from export.kinds import seq2seq as kind

    run, files = exported
    lite = zoo.load(files["steps"])
    one_file = zoo.load(files["greedy"])
    # Its graph decodes up to max_target_length; cut at the limit the others scale to
    # the input, it answers what they answer.
    full = keras_task.model.max_target_length  # the export's too
    want = keras_task.generate(TEXTS)
    assert one_file.generate(TEXTS) == lite.generate(TEXTS) == want
    assert lite.generate(TEXTS, max_length=full) == keras_task.generate(TEXTS, max_length=full)
    with pytest.raises(
        ValueError,
        match=r"greedy.tflite decodes greedily inside one WHILE.*"
        r"sampler='beam'.*format='tflite'",
    ):
        one_file.generate(TEXTS, sampler="beam")
    # A SavedModel without the encode / decode_step signatures (an earlier exporter's)
    # is refused in one line, not decoded another way.
    endpoints = kind.Seq2SeqKind.serving_endpoints
    monkeypatch.setattr(
        kind.Seq2SeqKind,
        "serving_endpoints",
        lambda self, source: [
            e for e in endpoints(self, source) if e.name not in ("encode", "decode_step")
        ],
    )
    with pytest.raises(ValueError, match=r"without the encode / decode_step.*export its run"):
        zoo.load(export_savedmodel(run, str(tmp_path / "serving" / "s2s")))
    with pytest.raises(ValueError, match="max_length"):
        lite.generate(TEXTS, sampler="beam", max_length=full + 1)
    with pytest.raises(ValueError, match="num_return_sequences"):
        lite.generate(TEXTS, sampler=samplers.Beam(width=2), num_return_sequences=3)
    with pytest.raises(ValueError, match="more than the model's"):
        lite.generate(["abcdefghij" * 20])
