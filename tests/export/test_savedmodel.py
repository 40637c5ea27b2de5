"""SavedModel export for TF Serving: signatures seen from a clean process, REST bodies,
warm-up requests, versions, atomicity and bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from export import savedmodel, warmup
from export.__main__ import main
from tests.support.paths import ROOT
from tests.support.runs import SENTENCES, TAGS, make_tagger_run, run_clean
from zoo import atomic


@pytest.fixture(scope="module")
def tagger_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("sm")
    run = root / "run"
    model = make_tagger_run(str(run))
    version_dir = savedmodel.export_savedmodel(str(run), str(root / "serving" / "tagger"))
    # Independent reference: the Tagger's own eager tagging path.
    reference = model.tag([" ".join(s) for s in SENTENCES])
    return run, root / "serving" / "tagger", version_dir, reference


# The clean process decodes REST bodies the way TF Serving's JSON API does: row
# format stacks each named input across instances; columnar format takes each
# input as one nested list; strings become tf.string, numbers take the dtype
# the signature declares. All bodies go through one process (TF starts slowly).
_REST_CLIENT = r"""
import json, sys
import tensorflow as tf
export_dir, bodies = sys.argv[1], json.loads(sys.argv[2])
loaded = tf.saved_model.load(export_dir)
def decode(v):
    if v.dtype == tf.string:
        return tf.nest.map_structure(lambda b: b.decode(), v.numpy().tolist())
    return v.numpy().tolist()
results = []
for body in bodies:
    fn = loaded.signatures[body.get("signature_name", "serving_default")]
    specs = fn.structured_input_signature[1]
    if "instances" in body:
        rows = body["instances"]
        columns = {k: [r[k] for r in rows] for k in specs} if isinstance(rows[0], dict) else {next(iter(specs)): rows}
    else:
        columns = body["inputs"] if isinstance(body["inputs"], dict) else {next(iter(specs)): body["inputs"]}
    feed = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in columns.items()}
    results.append({k: decode(v) for k, v in fn(**feed).items()})
project = [m for m in sys.modules if m.split(".")[0] in ("layers", "zoo", "train", "export")]
assert not project, project
print(json.dumps(results))
"""


def _bodies(version_dir):
    from zoo.tagger.model import pad_tokens

    sentences = [" ".join(s) for s in SENTENCES]
    with open(os.path.join(version_dir, "signature.json")) as f:
        doc = json.load(f)
    bodies = {
        "instances": {
            "signature_name": "serving_default",
            "instances": [{"sentences": s} for s in sentences],
        },
        "inputs": {"signature_name": "serving_default", "inputs": {"sentences": sentences}},
        "tokens": {
            "signature_name": "tag_tokens",
            "inputs": {"tokens": pad_tokens(SENTENCES).numpy().astype(str).tolist()},
        },
    }
    for name, sig in doc["signatures"].items():
        for key in ("example_request_instances", "example_request_inputs"):
            bodies[f"{name}/{key}"] = sig[key]
    return doc, bodies


@pytest.fixture(scope="module")
def clean_results(tagger_export):
    _, _, version_dir, _ = tagger_export
    doc, bodies = _bodies(version_dir)
    names = list(bodies)
    proc = run_clean(_REST_CLIENT, str(version_dir), json.dumps([bodies[n] for n in names]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc, dict(zip(names, results))


@pytest.mark.slow
@pytest.mark.parametrize("form", ["instances", "inputs"])
def test_raw_text_signature_rest_forms_in_clean_process(tagger_export, clean_results, form):
    reference = tagger_export[3]
    out = clean_results[1][form]
    for row, tags, length, ref in zip(out["tokens"], out["tags"], out["lengths"], reference):
        assert length == len(ref)
        assert row[:length] == [tok for tok, _ in ref]
        assert tags[:length] == [tag for _, tag in ref]
        assert all(t == "" for t in tags[length:])
        assert all(t in TAGS for t in tags[:length])


@pytest.mark.slow
def test_signature_json_examples_run_in_clean_process(clean_results):
    doc, results = clean_results
    assert set(doc["signatures"]) == {"serving_default", "tag_tokens", "predict_ids"}
    for name, sig in doc["signatures"].items():
        for key in ("example_request_instances", "example_request_inputs"):
            assert set(results[f"{name}/{key}"]) == set(sig["outputs"]), (name, key)
    rows = doc["signatures"]["predict_ids"]["example_request_inputs"]["inputs"]["word_ids"]
    out = results["predict_ids/example_request_inputs"]
    probs = np.array(out["probabilities"])
    assert probs.shape == (len(rows), len(rows[0]), len(TAGS))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(np.argmax(probs, -1), out["tag_ids"])
    # Row and columnar forms of the same example give the same answer.
    for name in doc["signatures"]:
        assert (
            results[f"{name}/example_request_instances"]
            == results[f"{name}/example_request_inputs"]
        )


def test_tokens_signature_matches_keras_core(tagger_export, clean_results):
    run = tagger_export[0]
    import keras

    import zoo.models  # noqa: F401  (registers every class zoo model files name)
    from zoo.tagger.model import pad_tokens

    model = keras.models.load_model(os.path.join(run, "model.keras"))
    tokens = pad_tokens(SENTENCES)
    want = np.argmax(model.core(model.encode_tf(tokens)), -1)
    got = np.array(clean_results[1]["tokens"]["tag_ids"])
    mask = tokens.numpy() != b""
    np.testing.assert_array_equal(got[mask], want[mask])
    assert (got[~mask] == -1).all()


@pytest.mark.slow
def test_signature_rejects_bad_inputs_with_clear_message(tagger_export):
    _, _, version_dir, _ = tagger_export
    script = r"""
import sys, tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
try:
    fn(sentences=tf.constant([" ".join(["saw"] * 40)]))
except tf.errors.InvalidArgumentError as e:
    print("LEN", "max_len" in str(e))
try:
    fn(sentences=tf.constant([["a", "b"]]))
except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
    print("RANK", "sentences" in str(e) or "shape" in str(e))
try:
    fn(sentences=tf.constant([1, 2]))
except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
    print("DTYPE", "string" in str(e) or "dtype" in str(e))
ids = tf.saved_model.load(sys.argv[1]).signatures["predict_ids"]
spec = ids.structured_input_signature[1]
chars = tf.zeros([1, 3, spec["char_ids"].shape[-1]], tf.int32)
try:
    ids(word_ids=tf.constant([[1, 10**6, 2]]), char_ids=chars)
except tf.errors.InvalidArgumentError as e:
    print("RANGE", "word_ids must be <" in str(e))
"""
    proc = run_clean(script, str(version_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split()
    assert lines == ["LEN", "True", "RANK", "True", "DTYPE", "True", "RANGE", "True"], proc.stdout


@pytest.mark.slow
def test_saved_model_cli_lists_signatures(tagger_export):
    _, _, version_dir, _ = tagger_export
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run(
        [cli, "show", "--dir", str(version_dir), "--all"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("serving_default", "tag_tokens", "predict_ids"):
        assert f"signature_def['{name}']" in proc.stdout
    assert "inputs['sentences'] tensor_info" in proc.stdout
    assert "outputs['tags'] tensor_info" in proc.stdout


def test_warmup_requests_parse_with_tf_serving_protos(tagger_export):
    prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
    import tensorflow as tf

    _, _, version_dir, _ = tagger_export
    path = os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    signatures = set()
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        assert request.model_spec.name == "tagger"
        signatures.add(request.model_spec.signature_name)
        if request.model_spec.signature_name == "serving_default":
            sentences = tf.make_ndarray(request.inputs["sentences"])
            assert len(sentences) >= 1 and all(isinstance(s, bytes) and s for s in sentences)
    assert signatures == {"serving_default", "tag_tokens", "predict_ids"}


def test_next_version_and_immutable_versions(tagger_export, capsys):
    run, base, version_dir, _ = tagger_export
    assert os.path.basename(version_dir) == "1"
    assert main(["savedmodel", str(run), "--out", str(base), "--version", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0]
    assert savedmodel.next_version(str(base)) == 2


@pytest.mark.slow
def test_failed_export_leaves_previous_version_and_no_temp(tagger_export, monkeypatch):
    run, base, version_dir, _ = tagger_export
    before = sorted(os.listdir(base))
    mtime = os.path.getmtime(os.path.join(version_dir, "saved_model.pb"))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(warmup, "write", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        savedmodel.export_savedmodel(str(run), str(base))
    assert sorted(os.listdir(base)) == before
    assert os.path.getmtime(os.path.join(version_dir, "saved_model.pb")) == mtime


@pytest.mark.slow
def test_killed_export_leaves_previous_version_intact(tagger_export, tmp_path):
    run, base, version_dir, _ = tagger_export
    before = sorted(os.listdir(base))
    proc = subprocess.Popen(
        [sys.executable, "-m", "export", "savedmodel", str(run), "--out", str(base)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if any(n.startswith(atomic.PREFIX) for n in os.listdir(base)):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "export finished before it could be killed"
        time.sleep(0.3)  # let it write part of the SavedModel
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    after = os.listdir(base)
    assert sorted(n for n in after if not n.startswith(".")) == before
    assert os.path.exists(os.path.join(version_dir, "saved_model.pb"))
    # The next export run removes what the killed one left behind.
    atomic.clean_stale(str(base))
    assert sorted(os.listdir(base)) == before


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    not_run = tmp_path / "empty"
    not_run.mkdir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "model.keras").write_text("")
    (unknown / "config.json").write_text(json.dumps({"kind": "hovercraft"}))
    cases = [
        (["savedmodel", str(tmp_path / "missing"), "--out", str(tmp_path / "o")], "no such"),
        (["savedmodel", str(not_run), "--out", str(tmp_path / "o")], "not a run directory"),
        (["savedmodel", str(unknown), "--out", str(tmp_path / "o")], "hovercraft"),
        (["savedmodel", str(not_run), "--out", str(a_file)], "not a directory"),
        (["savedmodel", str(not_run), "--out", str(tmp_path / "o"), "--version", "0"], "--version"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert a_file.read_text() == "x"
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_zoo_load_tags_with_the_savedmodel_like_keras(tagger_export):
    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    run, base, version_dir, reference = tagger_export
    for path in (base, version_dir):
        tagger = zoo.load(path)
        assert (tagger.kind, tagger.format) == ("tagger", "savedmodel")
        assert tagger.tag([" ".join(s) for s in SENTENCES]) == reference
    assert zoo.load(run).tag([list(s) for s in SENTENCES]) == reference


@pytest.mark.slow
def test_raw_text_signature_splits_as_python_does(tagger_export):
    """serving_default splits on every character str.split() splits on (no-break and
    ideographic spaces, NEL, ...), as Tagger.tag and zoo.lite do; tf.strings.split alone
    splits on ASCII whitespace only."""
    import tensorflow as tf

    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    run, _, version_dir, _ = tagger_export
    sentences = ["I\u00a0saw a\u3000saw", "\u2003they can\x85can the\u2028fish "]
    tokens = [s.split() for s in sentences]
    assert [len(t) for t in tokens] == [4, 5]
    out = tf.saved_model.load(version_dir).signatures["serving_default"](
        sentences=tf.constant(sentences)
    )
    got = [
        [t.decode() for t, ok in zip(row, mask) if ok]
        for row, mask in zip(out["tokens"].numpy(), out["tag_ids"].numpy() >= 0)
    ]
    assert got == tokens
    want = zoo.load(run).tag(tokens)
    tags = [[t.decode() for t in row[: len(tok)]] for row, tok in zip(out["tags"].numpy(), tokens)]
    assert tags == [[tag for _, tag in row] for row in want]
