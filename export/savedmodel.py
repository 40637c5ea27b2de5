"""SavedModel export in the TF Serving layout: BASE/NAME/<version>/.

Built with `keras.export.ExportArchive` (`write`); each kind supplies named signatures.
The version directory is built under a temporary name beside it, proven
(reloaded and every signature called on its example, outputs compared with
the live functions), and only then renamed into place, with the app bundle
(export/bundle.py: preprocessing.json, labels, model card) inside it. Every
signature checks its inputs' shapes first (the stock model server feeds what a
client sends, unchecked), then the kind's own checks run (docs/deploy.md, "What
a signature answers").
"""

import json
import os

import numpy as np

from export import bundle, kinds, rundir, warmup
from export.errors import ExportError
from zoo import atomic, litert
from zoo import run_lock as runlock
from zoo.cli import UsageError

SIGNATURE_JSON = "signature.json"


def next_version(base):
    versions = [int(n) for n in os.listdir(base) if n.isdigit()] if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def write(path, functions, tracked=()):
    """Writes `functions` ({signature name: (fn, input specs)}) as a SavedModel at `path`
    with `keras.export.ExportArchive`, tracking `tracked` (the Keras model or layers whose
    variables the functions use, and TF trackables such as lookup tables)."""
    import keras

    if "serve" in functions and len(functions) > 1:
        # docs/facts.md: the converter then silently keeps only serving_default.
        raise ExportError("an endpoint may not be called 'serve' next to others")
    archive = keras.export.ExportArchive()
    for t in tracked:
        archive.track(t)
    for name, (fn, specs) in functions.items():
        archive.add_endpoint(name, fn, input_signature=list(specs))
    archive.write_out(path, verbose=False)


def _shape_checked(endpoint):
    """`endpoint.fn` with every input's shape checked against its spec first
    (kinds.assert_shape): the stock model server feeds what a client sends."""

    def fn(*args):
        return endpoint.fn(*[kinds.assert_shape(a, s) for a, s in zip(args, endpoint.specs)])

    return fn


def _spec_json(spec):
    return {"dtype": spec.dtype.name, "shape": [None if d is None else int(d) for d in spec.shape]}


# Example bodies with more values than this (seq2seq's decode_step: KV caches)
# are left out of signature.json; the signature's inputs and outputs stay.
MAX_EXAMPLE_VALUES = 4096


def rest_bodies(endpoint):
    """The example as TF Serving REST bodies in row and columnar form; None for
    a form that cannot carry it (row form: inputs without a shared batch
    dimension) or an example of more than MAX_EXAMPLE_VALUES values."""
    arrays = [np.asarray(v) for v in endpoint.example.values()]
    if sum(a.size for a in arrays) > MAX_EXAMPLE_VALUES:
        return None, None
    columns = {k: a.tolist() for k, a in zip(endpoint.example, arrays)}
    instances = None
    if all(a.ndim for a in arrays) and len({len(a) for a in arrays}) == 1:
        instances = {
            "signature_name": endpoint.name,
            "instances": [{k: columns[k][i] for k in columns} for i in range(len(arrays[0]))],
        }
    return instances, {"signature_name": endpoint.name, "inputs": columns}


def _same_tensors(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b)
    )


def _prove(tmp, endpoints):
    """Reloads the written SavedModel and checks every signature against its fn."""
    import tensorflow as tf

    loaded = tf.saved_model.load(tmp)
    outputs = {}
    # Keras's outputs of each fn on its last example, reused when the next signature of
    # that fn has an equal example: seq2seq's serving_default and translate run its eager
    # greedy loop (a Python body per token: seconds) once, not twice.
    reference = {}
    for e in endpoints:
        if e.name not in loaded.signatures:
            raise ExportError(f"signature {e.name!r} missing from the written SavedModel")
        signature = loaded.signatures[e.name]
        feed = {
            s.name: tf.constant(warmup._as_array(e.example[s.name]), dtype=s.dtype) for s in e.specs
        }
        got = signature(**feed)
        args = [feed[s.name] for s in e.specs]
        seen = reference.get(id(e.fn))
        if seen is None or not _same_tensors(seen[0], args):
            reference[id(e.fn)] = seen = (args, e.fn(*args))
        want = {k: np.asarray(v) for k, v in seen[1].items()}
        why = litert.gate(litert.compare(want, {k: np.asarray(v) for k, v in got.items()}), 1e-5, 1)
        if why:
            raise ExportError(f"signature {e.name!r} differs from Keras: {'; '.join(why)}")
        outputs[e.name] = {k: v for k, v in signature.structured_outputs.items()}
    return outputs


def export_savedmodel(source, out, version=None):
    """Exports RUN_DIR_OR_MODEL to `out`/<version>/ for TF Serving.

    Args:
        source: run directory, .keras file or live keras.Model.
        out: BASE/NAME; the model's TF Serving directory (its basename names the
            model in the warm-up requests).
        version: integer version; default the next free one.

    Returns:
        The path of the version directory written.
    """
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out exists and is not a directory: {out}")
    runlock.check_writable_ancestor(os.path.join(out, "1"), "--out")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise UsageError(f"--version must be a positive integer, got {version!r}")
        target = os.path.join(out, str(version))
        if os.path.exists(target):
            raise UsageError(f"version {version} already exists: {target} (versions are immutable)")
    runlock.refuse_if_held(out)
    src = rundir.resolve(source)
    kind = kinds.get(src.kind)
    tracked = [kind.model(src), *kind.resources(src)]
    endpoints = kind.serving_endpoints(src)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out {out}: {e.strerror}") from None
    with runlock.locked(out):
        atomic.clean_stale(out)
        version = version or next_version(out)
        target = os.path.join(out, str(version))
        model_name = os.path.basename(out)
        with atomic.building(target, directory=True) as tmp:
            write(tmp, {e.name: (_shape_checked(e), e.specs) for e in endpoints}, tracked)
            warmup.write(tmp, model_name, [(e.name, e.example) for e in endpoints])
            refs = {}
            if "tokenizer" in (extra := kind.bundle_extra_files(src)):
                # The tokenizer file for clients, beside the graph (the graph never
                # reads it), where the bundle points to it.
                name, content = extra["tokenizer"]
                refs["tokenizer"] = f"assets.extra/{name}"
                os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
                with open(os.path.join(tmp, refs["tokenizer"]), "wb") as f:
                    f.write(content)
            # The app bundle (export/bundle.py), inside the version directory that is
            # renamed into place as a whole.
            shipped = ["saved_model.pb", "variables/", SIGNATURE_JSON, "assets.extra/"]
            for name, content in bundle.files(src, kind, "savedmodel", shipped, refs=refs).items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content)
            outputs = _prove(tmp, endpoints)
            doc = {
                "model": model_name,
                "version": version,
                "kind": kind.name,
                "rest_url": f"POST /v1/models/{model_name}:predict",
                "signatures": {},
            }
            for e in endpoints:
                instances, columnar = rest_bodies(e)
                doc["signatures"][e.name] = {
                    "doc": e.doc,
                    "inputs": {s.name: _spec_json(s) for s in e.specs},
                    # sorted: a reloaded signature's outputs come in no fixed order
                    "outputs": {k: _spec_json(v) for k, v in sorted(outputs[e.name].items())},
                    "example_request_instances": instances,
                    "example_request_inputs": columnar,
                }
            with open(os.path.join(tmp, SIGNATURE_JSON), "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
        return target
