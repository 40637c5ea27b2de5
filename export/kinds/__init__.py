"""Export plugins, one module per zoo model kind.

A kind plugs in by adding `export/kinds/<kind>.py` that defines `KIND`, an
instance of an `ExportKind` subclass (it may also list `ALIASES`, other
config "kind" values it serves). Nothing else in export/ changes.

The exporters talk to a kind through these methods:

- `core_specs(source, static_length)` / `core_fn(source)`: the id-level
  function (numbers in, numbers out) that goes into TFLite and that `verify`
  compares: named `tf.TensorSpec`s and a function taking them positionally
  and returning a dict of named outputs.
- `serving_endpoints(source)`: the SavedModel signatures (`Endpoint`s), e.g.
  raw text in, tags out for the tagger; each with example inputs used for the
  warm-up requests and the REST examples in signature.json.
- `resources(source)`: extra trackables the endpoints use (lookup tables).
- `sample_inputs(source, n, specs)`: id-level inputs for calibration and checks.
- `valid_mask(inputs)`: which output positions count in comparisons.
- `metric(source, inputs, outputs)`: the task metric for `verify`.
- `sidecar(source)`: what an app needs beside the .tflite (labels, vocab).
- `preprocessing(source, refs)`, `labels(source)`, `bundle_extra_files(source)`,
  `card_keys`, `intended_use`, `limitations`: the app bundle
  every export writes (export/bundle.py).
"""

import dataclasses
import importlib
import pkgutil

import numpy as np

from zoo.cli import UsageError


def checked(tensor, *assertions):
    """`tensor`, readable only after `assertions` (tf.debugging ops) passed.

    A data dependency, not just the function's automatic control edges: those
    only order stateful ops, so a gather fed by a bad id could run, and fail
    with its own message, before the assertion that names the input."""
    import tensorflow as tf

    with tf.control_dependencies(assertions):
        return tf.identity(tensor)


def run_core(fn, specs, inputs):
    """`fn` (a kind's `core_fn`) on `inputs` (arrays by spec name): {output: array}."""
    import tensorflow as tf

    return {k: np.asarray(v) for k, v in fn(*[tf.constant(inputs[s.name]) for s in specs]).items()}


def assert_ids_in_range(ids, size, name, limit="the size of the embedding table", padding=True):
    """Serving-time check that `ids` index a table of `size` rows; returns `ids`
    gated on it (use the returned tensor).

    Out-of-range ids would make a CPU gather fail with a message that names
    no input, and a GPU gather silently return zeros; TF Serving users get
    this message (naming the input and the range) instead. Runs inside the
    SavedModel signature functions only, never in TFLite graphs. `limit` says
    what `size` is; `padding`: whether id 0 is padding (the message says so)."""
    import tensorflow as tf

    low = f"{name} must be >= 0" + (" (0 is padding)" if padding else "")
    return checked(
        ids,
        tf.debugging.assert_non_negative(ids, message=low),
        tf.debugging.assert_less(
            ids, tf.cast(size, ids.dtype), message=f"{name} must be < {size}, {limit}"
        ),
    )


def assert_shape(tensor, spec):
    """`tensor` gated on a check, at run time, that its shape is `spec`'s: its rank and
    every dimension the spec fixes (use the returned tensor).

    The stock model server checks no shapes: a request of another rank or size would
    fail in whichever kernel met it first, or be answered wrongly. The shape is read
    through an op of unknown shape, so graph optimisation cannot fold the check into
    the declared static shape."""
    import tensorflow as tf

    dims = [None if d is None else int(d) for d in spec.shape]
    unknown = tf.compat.v1.placeholder_with_default(tensor, None)
    # With a leading 1 (one more axis): a scalar's shape is "1", not the empty string,
    # which an empty pattern failed to refuse in the served graph.
    actual = tf.strings.reduce_join(
        tf.strings.as_string(tf.shape(tf.expand_dims(unknown, 0))), separator=","
    )
    pattern = ",".join(["1"] + ["[0-9]+" if d is None else str(d) for d in dims])
    shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
    message = f"{spec.name} must have shape {shown} (? any size); it has"
    ok = tf.strings.regex_full_match(actual, pattern)
    shape = tf.strings.regex_replace(actual, "^1,?", "")
    return checked(tensor, tf.debugging.Assert(ok, [message, shape]))


def pad_empty(tensor, axes=(0,)):
    """`tensor` with one padding entry (0, or "" for strings) added along each of
    `axes` that is empty; unchanged otherwise.

    A signature runs its model on at least one row and position and cuts the
    outputs back (`cut_to`): some CPU kernels fail, or return misshapen
    outputs, on a dimension of 0 (an empty request batch), and an in-graph
    argmax over an empty axis does."""
    import tensorflow as tf

    shape = tf.shape(tensor)
    paddings = [[0, 0]] * tensor.shape.rank
    for axis in axes:
        paddings[axis] = [0, tf.cast(tf.equal(shape[axis], 0), tf.int32)]
    return tf.pad(tensor, paddings)


def cut_to(outputs, *sizes):
    """`outputs` (a dict of tensors) cut to `sizes` along their first axes (the
    real batch and time of an input `pad_empty` padded)."""
    return {
        name: value[tuple(slice(None, size) for size in sizes[: value.shape.rank])]
        for name, value in outputs.items()
    }


@dataclasses.dataclass
class Endpoint:
    """One SavedModel signature.

    Attributes:
        name: signature key ("serving_default" for the main one).
        fn: callable taking the tensors of `specs` positionally, returning a
            dict of named output tensors.
        specs: list of named `tf.TensorSpec` (the signature's inputs).
        example: dict input name -> list/array: one small real batch, used for
            the warm-up requests and the example REST body.
        doc: one line for signature.json.
    """

    name: str
    fn: object
    specs: list
    example: dict
    doc: str = ""


class ExportKind:
    """Generic plugin: any Keras model with named inputs (also the base class)."""

    name = "keras"
    # Output (by name) whose last axis holds class scores, for argmax agreement.
    class_output = None
    # SavedModel signature that takes the core inputs (what verify compares), and the
    # core output each of its outputs names differently ({signature's: core's}).
    id_signature = "serving_default"
    id_outputs = {}

    # The class of the kind's models as (module, name), imported when asked.
    model_class = None

    def matches(self, model):
        """Whether `model` is a `model_class`."""
        if self.model_class is None:
            return False
        module, name = self.model_class
        return isinstance(model, getattr(importlib.import_module(module), name))

    # What the kind's models are ("a zoo Tagger"): `model` refuses any other; None: any.
    expected = None

    def model(self, source):
        model = source.ensure_model()
        if self.expected and not self.matches(model):
            raise UsageError(
                f"{source.path}: model {getattr(model, 'name', '?')!r} "
                f"({type(model).__name__}) is not {self.expected}"
            )
        return model

    def core(self, source):
        """The Keras model whose numbers the exports must reproduce."""
        return self.model(source)

    # ---------------------------------------------------------- id level
    def core_specs(self, source, static_length=None):
        """Named TensorSpecs of the core inputs; static: batch 1, fixed length."""
        import tensorflow as tf

        specs = []
        for t in self.core(source).inputs:
            shape = list(t.shape)
            if static_length is not None:
                shape = [1] + [int(static_length) if d is None else d for d in shape[1:]]
            specs.append(tf.TensorSpec(shape, tf.as_dtype(t.dtype), name=_input_name(t)))
        return specs

    def core_fn(self, source, static=False):
        """The id-level function; `static` asks for the GPU-clean variant."""
        core = self.core(source)
        names = [_input_name(t) for t in core.inputs]
        out_names = list(getattr(core, "output_names", None) or [])
        if len(out_names) != len(core.outputs):
            out_names = [f"output_{i}" for i in range(len(core.outputs))]

        def fn(*args):
            y = core(args[0] if len(args) == 1 else dict(zip(names, args)), training=False)
            if isinstance(y, dict):
                return dict(y)
            return dict(zip(out_names, y)) if isinstance(y, (list, tuple)) else {out_names[0]: y}

        return fn

    def check_static(self, source, static_length):
        """Raises UsageError when a static export needs a length it lacks."""
        for t in self.core(source).inputs:
            if any(d is None for d in t.shape[1:]) and static_length is None:
                raise UsageError(
                    f"input {_input_name(t)!r} has a variable dimension {tuple(t.shape)}: "
                    "--static-shape needs --length"
                )

    def default_length(self, source):
        return None

    # ---------------------------------------------------------- serving
    def serving_endpoints(self, source):
        specs = self.core_specs(source)
        return [
            Endpoint(
                "serving_default",
                self.core_fn(source),
                specs,
                self.sample_inputs(source, 2, specs=specs),
                "the model's own inputs and outputs",
            )
        ]

    def resources(self, source):
        return []

    # ---------------------------------------------------------- data
    def sample_inputs(self, source, n, specs):
        """n rows of id-level inputs for `specs`: calibration.npz rows, else synthetic."""
        calib = source.calibration()
        if calib is not None and all(s.name in calib for s in specs):
            return {s.name: fit_to_spec(calib[s.name][:n], s) for s in specs}
        rng = np.random.default_rng(0)
        out = {}
        for s in specs:
            shape = [n if i == 0 and d in (None, 1) else (d or 8) for i, d in enumerate(s.shape)]
            dtype = s.dtype.as_numpy_dtype
            if np.issubdtype(dtype, np.integer):
                out[s.name] = rng.integers(0, 2, size=shape).astype(dtype)
            else:
                out[s.name] = rng.standard_normal(shape).astype(dtype)
        return out

    def calibration_inputs(self, source, specs):
        """The rows int8 calibration reads: 200 of `sample_inputs`."""
        return self.sample_inputs(source, 200, specs=specs)

    def valid_mask(self, inputs):
        return None

    def metric(self, source, inputs, outputs):
        """(name, value) of the task metric for these outputs, or None."""
        return None

    def sidecar(self, source, static_length=None):
        return {"kind": self.name}

    # ---------------------------------------------------------- bundle (export/bundle.py)
    intended_use = "Research and teaching: a small attention model from the attention-zoo."
    limitations = "Trained on the data named above only; measure it on your own data first."

    def labels(self, source):
        """Output label names (id = index), or None: the bundle's labels.txt."""
        return None

    def bundle_extra_files(self, source):
        """{role: (file name, bytes)} an app needs that the bundle writes unless the
        export already ships it (e.g. seq2seq's "tokenizer": spm.model, which a
        SavedModel ships in `assets.extra/` for clients)."""
        return {}

    def preprocessing(self, source, refs):
        """The body of preprocessing.json: the model's inputs as numbers (a bare
        Keras model has no text rules). `refs`: {role: file name} of the bundle."""
        return {
            "inputs": {
                s.name: {"dtype": s.dtype.name, "shape": [d for d in s.shape]}
                for s in self.core_specs(source)
            },
            "rules": "none: the model's inputs are numbers, fed as they are",
            "test_vectors": [],
        }

    # metrics.json keys the model card reports, where numbers; None: the test split's.
    card_keys = None


def _input_name(t):
    name = getattr(t, "name", None) or "input"
    return name.split(":")[0]


def fit_to_spec(array, spec):
    """Pads with zeros / truncates each static non-batch dim to the spec's size."""
    array = np.asarray(array)
    target = [array.shape[0]] + [
        array.shape[i] if d is None else d for i, d in enumerate(spec.shape) if i > 0
    ]
    if list(array.shape) == target:
        return array.astype(spec.dtype.as_numpy_dtype)
    out = np.zeros(target, dtype=spec.dtype.as_numpy_dtype)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(array.shape, target))
    out[sl] = array[sl]
    return out


_GENERIC = ExportKind()


def available():
    """Kind names with a plugin module (without importing them)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def get(kind):
    """The plugin for `kind`; UsageError naming the known kinds otherwise."""
    if kind == "keras":
        return _GENERIC
    if kind in available():
        return importlib.import_module(f"{__name__}.{kind}").KIND
    for name in available():
        module = importlib.import_module(f"{__name__}.{name}")
        if kind in getattr(module, "ALIASES", ()):
            return module.KIND
    raise UsageError(
        f"unknown model kind {kind!r} (export supports: {', '.join(available() + ['keras'])})"
    )


def detect(model):
    """The kind of a live model: the first plugin that claims it, else "keras"."""
    for name in available():
        if get(name).matches(model):
            return name
    return "keras"
