"""verify: the same inputs through Keras, the SavedModel and LiteRT.

The SavedModel runs in a fresh Python process that never imports this
project (as TF Serving sees it); the process checks that itself.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from export import kinds, runtime, rundir
from export.errors import ExportError, UsageError

_PROJECT = ("layers", "zoo", "train", "export", "benchmarks")

_CHILD = r"""
import sys, numpy as np, tensorflow as tf
inputs_path, saved, signature, out_path = sys.argv[1:5]
loaded = tf.saved_model.load(saved)
fn = loaded.signatures[signature]
with np.load(inputs_path) as data:
    feed = {k: tf.constant(data[k]) for k in data.files}
result = fn(**feed)
project = sorted(m for m in sys.modules if m.split(".")[0] in %r)
if project:
    raise SystemExit("project modules imported in the clean process: %%s" %% project)
np.savez(out_path, **{k: v.numpy() for k, v in result.items()})
""" % (_PROJECT,)


def resolve_version_dir(path):
    """BASE/NAME (highest version) or BASE/NAME/<version> -> the version dir."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    if os.path.isdir(path):
        versions = [int(n) for n in os.listdir(path) if n.isdigit()
                    and os.path.exists(os.path.join(path, n, "saved_model.pb"))]
        if versions:
            return os.path.join(path, str(max(versions)))
    raise UsageError(f"not a SavedModel or TF Serving model directory: {path}")


def tflite_specs(details):
    """TensorSpecs (batch left free) of a LiteRT signature's inputs."""
    import tensorflow as tf

    return [tf.TensorSpec([None] + [None if int(x) < 0 else int(x) for x in d["shape_signature"][1:]],
                          d["dtype"], name=k) for k, d in details.items()]


def run_savedmodel_clean(saved_dir, inputs, signature):
    """Calls `signature` of `saved_dir` in a fresh process without the project."""
    with tempfile.TemporaryDirectory(prefix="export-verify-") as tmp:
        in_path, out_path = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(in_path, **inputs)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, in_path, os.path.abspath(saved_dir), signature, out_path],
            cwd=tmp, env=env, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise ExportError(f"SavedModel signature {signature!r} failed in a clean process: {tail}")
        with np.load(out_path) as data:
            return {k: data[k] for k in data.files}


def verify(run_dir, savedmodel=None, tflite=None, samples=64):
    """Returns a report dict comparing Keras with the given exports."""
    import tensorflow as tf

    if savedmodel is None and tflite is None:
        raise UsageError("verify needs --savedmodel and/or --tflite")
    src = rundir.resolve(run_dir).held_out()
    kind = kinds.get(src.kind)
    kind.model(src)
    fn = kind.core_fn(src)

    specs = kind.core_specs(src)

    def keras_run(inputs):
        return {k: np.asarray(v) for k, v in fn(*[tf.constant(inputs[s.name]) for s in specs]).items()}

    report = {"source": src.path, "kind": kind.name, "rows_from": src.sample_file}
    inputs = kind.sample_inputs(src, samples, specs=specs)
    want = keras_run(inputs)
    float_metric = kind.metric(src, inputs, want)
    report["keras"] = {"metric": float_metric}
    if savedmodel is not None:
        saved_dir = resolve_version_dir(savedmodel)
        got = run_savedmodel_clean(saved_dir, inputs, kind.id_signature)
        report["savedmodel"] = {"path": saved_dir, "signature": kind.id_signature,
                                **runtime.compare(want, got, kind.valid_mask(inputs), kind.class_output)}
    if tflite is not None:
        if not os.path.isfile(tflite):
            raise UsageError(f"no such .tflite file: {tflite}")
        interp = runtime.interpreter(tflite)
        runner, _ = runtime.signature_runner(interp)
        details = runner.get_input_details()
        # A static-shape model sees the inputs padded / cut to its length;
        # Keras gets the same fitted inputs so both answer the same question.
        tspecs = tflite_specs(details)
        t_inputs = {s.name: kinds.fit_to_spec(inputs[s.name], s) for s in tspecs}
        t_want = keras_run(t_inputs)
        got = runtime.run(tflite, t_inputs)
        sidecar = {}
        if os.path.exists(tflite + ".json"):
            with open(tflite + ".json") as f:
                sidecar = json.load(f)
        entry = {"path": tflite, "quantize": sidecar.get("quantize"),
                 **runtime.compare(t_want, got, kind.valid_mask(t_inputs), kind.class_output)}
        entry["metric"] = kind.metric(src, t_inputs, got)
        entry["float_metric_same_inputs"] = kind.metric(src, t_inputs, t_want)
        report["tflite"] = entry
    return report


def format_report(report):
    lines = [f"verify {report['source']} ({report['kind']})"]
    if report["keras"]["metric"]:
        name, value = report["keras"]["metric"]
        lines.append(f"  keras       {name} {value:.4f}")
    for key in ("savedmodel", "tflite"):
        if key not in report:
            continue
        e = report[key]
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in e["max_abs_diff"].items())
        agree = "" if e["agreement"] is None else f"; argmax agreement {e['agreement']:.2%}"
        lines.append(f"  {key:<11} max abs diff {diffs}{agree}  [{e['path']}]")
        if e.get("metric"):
            name, value = e["metric"]
            fname, fvalue = e["float_metric_same_inputs"]
            lines.append(f"  {'':<11} {name} {value:.4f} ({e.get('quantize')}) vs float {fvalue:.4f}")
    return "\n".join(lines)
