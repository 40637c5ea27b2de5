"""`python -m export tflite|verify|bench`: builtin-only conversion proven against Keras."""

import json
import os

import numpy as np
import pytest

from export import bench, tflite, verify
from export.__main__ import main
from export.check import check_model, op_counts
from export.errors import ExportError
from tests.support.runs import SENTENCES, TAGS, make_dense_model, make_tagger_run


def _litert(path, x):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner("serving_default")
    return runner(**x)


@pytest.mark.slow
@pytest.mark.parametrize("quantize, tol", [("none", 1e-5), ("fp16", 1e-2), ("dynamic", 0.1)])
def test_dense_model_quantize_modes_match_keras(tmp_path, quantize, tol):
    model = make_dense_model()
    path = str(tmp_path / "m.tflite")
    result = tflite.export_tflite(model, path, quantize=quantize)
    x = np.random.default_rng(5).standard_normal((7, 8)).astype("float32")
    want = model.predict(x, verbose=0)
    got = _litert(path, {"features": x})["probs"]
    assert np.max(np.abs(got - want)) <= tol
    with open(path + ".json") as f:
        sidecar = json.load(f)
    assert sidecar["quantize"] == quantize and sidecar["inputs"]["features"]["dtype"] == "float32"
    assert result.size_bytes == os.path.getsize(path)


@pytest.fixture(scope="module")
def tagger_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("tagger") / "run"
    make_tagger_run(str(run))
    return run


@pytest.fixture(scope="module")
def cli_export(tagger_run, tmp_path_factory):
    """`python -m export tflite RUN --out tagger.tflite` (float, dynamic shapes) of the
    module's run, once for the tests that read it (read-only)."""
    path = str(tmp_path_factory.mktemp("cli-export") / "tagger.tflite")
    assert main(["tflite", str(tagger_run), "--out", path]) == 0
    return path


@pytest.mark.slow
def test_tagger_dynamic_export_sidecar_and_parity(tagger_run, cli_export):
    import keras

    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    path = cli_export
    with open(path + ".json") as f:
        side = json.load(f)
    assert (
        side["kind"] == "tagger"
        and side["tags"] == TAGS
        and side["words"][:2] == ["<pad>", "<unk>"]
    )
    assert side["max_chars"] == 8 and side["max_len"] == 16
    assert set(side["inputs"]) == {"word_ids", "char_ids"}
    assert set(side["outputs"]) == {"probabilities", "tag_ids"}
    assert not any(
        n.startswith(("Flex", "CUSTOM", "HASHTABLE")) for n in op_counts(open(path, "rb").read())
    )
    model = keras.models.load_model(os.path.join(tagger_run, "model.keras"))
    with np.load(os.path.join(tagger_run, "calibration.npz")) as d:
        x = {"word_ids": d["word_ids"][:5], "char_ids": d["char_ids"][:5]}
    want = np.asarray(model(x))
    got = _litert(path, x)
    mask = x["word_ids"] > 0
    assert np.max(np.abs(got["probabilities"] - want)[mask]) < 1e-4
    np.testing.assert_array_equal(got["tag_ids"][mask], np.argmax(want, -1)[mask])


@pytest.mark.slow
def test_zoo_load_tags_with_the_tflite_file_like_keras(tagger_run, cli_export):
    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    tagger = zoo.load(cli_export)
    assert (tagger.kind, tagger.format, tagger.tags) == ("tagger", "tflite", TAGS)
    sentences = [" ".join(s) for s in SENTENCES]
    assert tagger.tag(sentences) == zoo.load(tagger_run).tag(sentences)
    # A sentence without tokens tags to nothing (zoo.lite's contract), as from Keras.
    assert tagger.tag(["I saw", " "]) == zoo.load(tagger_run).tag(["I saw", " "])
    assert tagger.tag(["I saw", " "])[1] == []


@pytest.mark.slow
def test_tagger_static_export_passes_gpu_check(tagger_run, tmp_path):
    path = str(tmp_path / "gpu.tflite")
    tflite.export_tflite(str(tagger_run), path, static_shape=True)
    with open(path + ".json") as f:
        assert json.load(f)["inputs"]["word_ids"]["shape"] == [1, 16]
    problems = check_model(open(path, "rb").read(), "gpu")
    assert problems == [], "\n".join(map(str, problems))


@pytest.mark.slow
def test_tagger_int8_static_export_runs_in_integers_only(tagger_run, tmp_path):
    # Masks meet the scores as 0/1 floats (layers.masks.combine_masks): no
    # bool -> float cast is left to run outside the integer kernels.
    path = str(tmp_path / "int8.tflite")
    # The fixture is untrained: near-uniform probabilities whose argmax int8
    # rounding flips at random, so the parity gate is off here (a trained
    # tagger's int8 parity is measured by `make bench`, export figure).
    tflite.export_tflite(
        str(tagger_run), path, quantize="int8", static_shape=True, tolerance=1.0, min_agreement=0.0
    )
    content = open(path, "rb").read()
    problems = check_model(content, "int8")
    assert problems == [], "\n".join(map(str, problems))
    assert "CAST" not in op_counts(content)


@pytest.mark.slow
def test_int8_classifier_is_gated_on_argmax_agreement(tagger_run, tmp_path):
    # The untrained fixture flips many argmaxes under int8: the refusal must
    # name the agreement gate (not max abs diff), and leave no file behind.
    path = tmp_path / "int8.tflite"
    with pytest.raises(
        ExportError, match=r"LiteRT differs from Keras: argmax agrees on .*% < 95\.0% \(int8\)"
    ):
        tflite.export_tflite(str(tagger_run), str(path), quantize="int8", static_shape=True)
    assert not path.exists()


@pytest.mark.slow
def test_tagger_int16x8_static_export_matches_keras(tagger_run, tmp_path):
    import keras

    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    path = str(tmp_path / "i16.tflite")
    tflite.export_tflite(str(tagger_run), path, quantize="int16x8", static_shape=True)
    model = keras.models.load_model(os.path.join(tagger_run, "model.keras"))
    with open(path + ".json") as f:
        length = json.load(f)["inputs"]["word_ids"]["shape"][1]
    with np.load(os.path.join(tagger_run, "calibration.npz")) as d:
        words, chars = d["word_ids"][:4], d["char_ids"][:4]
    # The static model takes exactly `length` positions: crop or zero-pad the rows.
    words = np.pad(words[:, :length], ((0, 0), (0, max(0, length - words.shape[1]))))
    chars = np.pad(chars[:, :length], ((0, 0), (0, max(0, length - chars.shape[1])), (0, 0)))
    for i in range(len(words)):
        x = {"word_ids": words[i : i + 1], "char_ids": chars[i : i + 1]}
        want = np.asarray(model(x))
        got = _litert(path, x)["probabilities"]
        mask = x["word_ids"] > 0
        # int16 activations: far closer to float than int8's 0.35 gate.
        assert np.max(np.abs(got - want)[mask]) < 0.05


@pytest.mark.slow
def test_verify_and_bench_report(tagger_run, tmp_path):
    from export.savedmodel import export_savedmodel

    saved = export_savedmodel(str(tagger_run), str(tmp_path / "serving" / "tagger"))
    path = str(tmp_path / "t.tflite")
    tflite.export_tflite(str(tagger_run), path, quantize="dynamic")
    report = verify.verify(
        str(tagger_run), savedmodel=os.path.dirname(saved), tflite=path, samples=16
    )
    assert report["savedmodel"]["path"] == saved
    assert max(report["savedmodel"]["max_abs_diff"].values()) < 1e-5
    assert report["savedmodel"]["agreement"] == 1.0
    assert report["tflite"]["quantize"] == "dynamic" and report["tflite"]["agreement"] >= 0.85
    name, value = report["tflite"]["metric"]
    assert name == "accuracy" and 0.0 <= value <= 1.0
    assert report["rows_from"] == "calibration.npz"  # the fixture has no held-out rows
    b = bench.bench(path, runs=3, warmup=1)
    assert set(b["litert"]) == {1, 32} and set(b["keras"]) == {1, 32}
    assert b["size_bytes"] == os.path.getsize(path) and b["litert"][1]["p50_ms"] > 0


@pytest.mark.slow
def test_verify_measures_accuracy_on_held_out_rows(tagger_run, cli_export, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tagger_run, run)
    path = cli_export  # the run's float export (the copy holds the same model)
    with np.load(run / "calibration.npz") as d:
        rows = {k: d[k][:5] for k in d.files}
    # Held-out gold tags equal to the float model's own predictions give
    # accuracy 1.0; the fixture's calibration tags are random (about chance),
    # so the metric shows which rows verify read.
    import keras

    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    model = keras.models.load_model(run / "model.keras")
    predicted = np.argmax(
        np.asarray(model.core({"word_ids": rows["word_ids"], "char_ids": rows["char_ids"]})), -1
    )
    real = rows["word_ids"] > 0
    np.savez(
        run / "evaluation.npz",
        word_ids=rows["word_ids"],
        char_ids=rows["char_ids"],
        tag_ids=np.where(real, predicted, -1),
    )
    report = verify.verify(str(run), tflite=path, samples=5)
    assert report["rows_from"] == "evaluation.npz"
    assert report["keras"]["metric"] == ("accuracy", 1.0)


@pytest.mark.slow
def test_flex_model_fails_naming_ops_and_keeps_old_file(tmp_path, capsys):
    import keras

    inp = keras.Input((5,), name="x")
    out = keras.layers.Lambda(lambda t: keras.ops.argmax(t, axis=-1), name="argmax")(inp)
    model = keras.Model(inp, out)
    path = tmp_path / "m.tflite"
    path.write_bytes(b"previous model")
    with pytest.raises(ExportError, match="BitwiseAnd"):
        tflite.export_tflite(model, str(path))
    assert path.read_bytes() == b"previous model"
    assert sorted(os.listdir(tmp_path)) == ["m.tflite"]


def test_bad_input_exits_2(tagger_run, tmp_path, capsys):
    model_file = tmp_path / "m.keras"
    make_dense_model().save(model_file)
    cases = [
        (["tflite", str(tmp_path / "missing"), "--out", str(tmp_path / "a.tflite")], "no such"),
        (["tflite", str(tagger_run), "--out", str(tmp_path), "--quantize", "none"], "directory"),
        (
            ["tflite", str(tagger_run), "--out", str(tmp_path / "a.tflite"), "--quantize", "int4"],
            "int4",
        ),
        (
            ["tflite", str(model_file), "--out", str(tmp_path / "a.tflite"), "--quantize", "int8"],
            "calibration",
        ),
        (
            [
                "tflite",
                str(tagger_run),
                "--out",
                str(tmp_path / "a.tflite"),
                "--static-shape",
                "--length",
                "99",
            ],
            "max_len",
        ),
        (["verify", str(tagger_run)], "--savedmodel"),
        (["bench", str(tmp_path / "nope.tflite")], "no such"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert not (tmp_path / "a.tflite").exists()
