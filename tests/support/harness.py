"""The one shared layer test, and TFLite conversion utilities.

`run_layer_test` is applied to every layer in the project. It checks, stage by
stage, and raises `AssertionError` naming the failed stage:

1. `eager`: build + eager call; output shapes equal `expected_output_shape`
   and `compute_output_shape` of the concrete input shapes.
2. `symbolic`: a fresh layer called on `keras.Input`s with batch and sequence
   `None`; `compute_output_shape` agrees with the symbolic shapes.
3. `config`: `get_config` is JSON-serializable and `from_config` rebuilds an
   equal layer that, with copied weights, gives the same outputs.
4. `saving`: a functional model wrapping the layer saved to `.keras` and
   loaded with `safe_mode=True` and no `custom_objects` gives the same outputs.
5. `training`: one `train_on_batch` step (MSE vs a random target) gives a
   finite loss and changes a trainable weight.
6. `mixed_precision`: under `mixed_float16` and `mixed_bfloat16`, outputs are
   finite, of the compute dtype, close to float32; variables stay float32.
7. `masking`: with `input_mask`, the output's Keras mask equals the input's.
8. `tflite_static` / `tflite_dynamic`: ExportArchive -> SavedModel -> TFLite
   with builtin ops only; outputs match Keras within `tflite_atol`; the
   flatbuffer holds no Flex/custom op.

The TFLite helpers (`tflite_convert_and_run`, `convert_model_to_tflite`,
`run_tflite`, `tflite_ops`, `tflite_op_details`, `assert_builtin_only`) are
reusable on any Keras model with named inputs.
"""

import contextlib
import inspect
import json
import os
import tempfile
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from export.flatbuffer import enum_names, op_name, read_model, schema

ENDPOINT = "forward"
# Tolerance for mixed precision vs float32, relative to max(1, max |ref|).
MIXED_PRECISION_ATOL = {"mixed_float16": 2e-2, "mixed_bfloat16": 8e-2}


# --------------------------------------------------------------------------
# TFLite utilities
# --------------------------------------------------------------------------


def _input_dtype(array):
    array = np.asarray(array)
    if array.dtype == np.bool_:
        return "bool"
    if np.issubdtype(array.dtype, np.integer):
        return "int32"
    return "float32"


def _as_feed_array(array):
    array = np.asarray(array)
    return array.astype(_input_dtype(array))


def _named_outputs(outputs):
    """Keras outputs -> {"output_i": tensor}, in a stable order."""
    if isinstance(outputs, dict):
        return {key: outputs[key] for key in sorted(outputs)}
    return {f"output_{i}": t for i, t in enumerate(flatten_outputs(outputs))}


def flatten_outputs(outputs):
    """A tensor, a tuple/list or a dict of tensors -> list of tensors."""
    if isinstance(outputs, dict):
        return [outputs[key] for key in sorted(outputs)]
    if isinstance(outputs, (list, tuple)):
        flat = []
        for item in outputs:
            flat.extend(flatten_outputs(item))
        return flat
    return [outputs]


def _feed_for_model(model, inputs):
    """`inputs` ({name: array}) arranged the way `model` takes them."""
    structure = model.input
    if isinstance(structure, dict):
        return dict(inputs)
    if isinstance(structure, (list, tuple)):
        return [inputs[t.name] for t in structure]
    return inputs[structure.name] if structure.name in inputs else next(iter(inputs.values()))


def _input_names(model):
    structure = model.input
    if isinstance(structure, dict):
        return list(structure)
    if isinstance(structure, (list, tuple)):
        return [t.name for t in structure]
    return [structure.name]


def export_saved_model(model, input_shapes, directory, endpoint=ENDPOINT):
    """Writes `model` as a SavedModel with one endpoint via ExportArchive.

    Args:
        model: a Keras model with named inputs.
        input_shapes: {input name: (shape, dtype)}; `None` dims are dynamic.
        directory: where to write the SavedModel.
        endpoint: the signature name (never `serve`, see docs/facts.md).
    """
    names = _input_names(model)
    missing = set(names) - set(input_shapes)
    if missing:
        raise ValueError(
            f"No shape given for model inputs {sorted(missing)}. "
            f"Received: input_shapes keys={sorted(input_shapes)}"
        )
    structure = model.input
    signature = [tf.TensorSpec(input_shapes[n][0], input_shapes[n][1], name=n) for n in names]

    def forward(*tensors):
        if isinstance(structure, dict):
            feed = dict(zip(names, tensors))
        elif isinstance(structure, (list, tuple)):
            feed = list(tensors)
        else:
            feed = tensors[0]
        return _named_outputs(model(feed, training=False))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name=endpoint, fn=forward, input_signature=signature)
    archive.write_out(directory, verbose=False)


def convert_saved_model(directory, endpoint=ENDPOINT, quantize=None, representative_data=None):
    """Converts a SavedModel signature to TFLite with builtin ops only.

    Args:
        directory: the SavedModel directory.
        endpoint: the signature key to convert.
        quantize: `None` (float32), `"dynamic"` (dynamic-range int8 weights),
            `"float16"`, `"int8"` (full integer, builtin int8 kernels only) or
            `"int16x8"` (int16 activations, int8 weights).
        representative_data: for `"int8"` / `"int16x8"`, a list of
            {input name: array} samples used for calibration.

    Returns:
        The TFLite flatbuffer as bytes.
    """
    converter = tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=[endpoint])
    # Builtins only: a Flex op must fail here, not on the phone (docs/facts.md).
    ops_set = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif quantize in ("int8", "int16x8"):
        if not representative_data:
            raise ValueError(
                f"quantize={quantize!r} needs representative_data. "
                f"Received: representative_data={representative_data!r}"
            )

        def samples():
            for sample in representative_data:
                yield {k: _as_feed_array(v) for k, v in sample.items()}

        converter.representative_dataset = samples
        ops_set = (
            [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if quantize == "int8"
            else [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        )
    elif quantize not in (None, "dynamic"):
        raise ValueError(
            "`quantize` must be None, 'dynamic', 'float16', 'int8' or "
            f"'int16x8'. Received: quantize={quantize!r}"
        )
    converter.target_spec.supported_ops = ops_set
    return converter.convert()


def convert_model_to_tflite(model, input_shapes, quantize=None, representative_data=None):
    """ExportArchive -> SavedModel -> TFLite, in a temporary directory."""
    with tempfile.TemporaryDirectory() as directory:
        export_saved_model(model, input_shapes, directory)
        return convert_saved_model(
            directory, quantize=quantize, representative_data=representative_data
        )


def run_tflite(model_bytes, inputs, endpoint=ENDPOINT):
    """Runs a TFLite signature; inputs are resized to the given arrays.

    Returns:
        The outputs as a list ordered by output name (`output_0`, ...).
    """
    interpreter = Interpreter(model_content=model_bytes)
    runner = interpreter.get_signature_runner(endpoint)
    results = runner(**{k: _as_feed_array(v) for k, v in inputs.items()})
    return [np.asarray(results[key]) for key in sorted(results)]


def tflite_op_details(model_bytes):
    """Every operator of every subgraph, read from the flatbuffer.

    Returns:
        A list of dicts: `op` (`export.flatbuffer.op_name`: the builtin name,
        `CUSTOM:<code>` for a custom op, `Flex<Op>` for a Flex op), `inputs`
        and `outputs` (lists of tensor type names such as `FLOAT32`, `INT8`),
        `input_shapes` (the stored shapes, signatures use -1 for dynamic dims
        in `shape_signature`).
    """
    model = read_model(model_bytes)
    types = enum_names(schema().TensorType)
    details = []
    for subgraph in model.subgraphs:
        tensors = subgraph.tensors
        for operator in subgraph.operators:
            name = op_name(model, operator)

            def describe(indices):
                return [
                    types.get(tensors[i].type, str(tensors[i].type))
                    for i in (indices if indices is not None else [])
                    if i >= 0
                ]

            details.append(
                {
                    "op": name,
                    "inputs": describe(operator.inputs),
                    "outputs": describe(operator.outputs),
                    "input_shapes": [
                        None if tensors[i].shape is None else tensors[i].shape.tolist()
                        for i in (operator.inputs if operator.inputs is not None else [])
                        if i >= 0
                    ],
                }
            )
    return details


def tflite_ops(model_bytes):
    """The operator names of a TFLite model, in graph order."""
    return [detail["op"] for detail in tflite_op_details(model_bytes)]


def assert_builtin_only(op_names):
    """Fails when the op list holds a Flex or custom op."""
    bad = [name for name in op_names if name.startswith("CUSTOM") or "Flex" in name]
    assert not bad, f"TFLite model holds Flex/custom ops: {sorted(set(bad))}"


@dataclass
class TFLiteResult:
    outputs: list  # TFLite outputs, ordered like flatten_outputs(keras outputs)
    expected: list  # Keras outputs on the same inputs
    ops: list  # operator names
    model_bytes: bytes

    @property
    def max_abs_diff(self):
        diffs = [
            float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
            if np.size(a)
            else 0.0
            for a, b in zip(self.outputs, self.expected)
        ]
        return max(diffs) if diffs else 0.0


def tflite_convert_and_run(
    model,
    inputs,
    *,
    dynamic_axes=None,
    quantize=None,
    representative_data=None,
    extra_inputs=(),
):
    """Converts `model` to TFLite and runs it next to Keras on `inputs`.

    Args:
        model: a Keras model with named inputs.
        inputs: {input name: array}.
        dynamic_axes: {input name: axes} exported as `None` (dynamic); the
            shape is static where not listed. `None` means all static.
        quantize, representative_data: see `convert_saved_model`.
        extra_inputs: more {input name: array} feeds run through the same
            converted model (e.g. other lengths for a dynamic model); their
            outputs are appended to `outputs` / `expected` in order.

    Returns:
        A `TFLiteResult`. Asserts that the model has only builtin ops and the
        same number of outputs as Keras; the caller checks the values.
    """
    dynamic_axes = dynamic_axes or {}
    input_shapes = {}
    for name, array in inputs.items():
        shape = list(np.shape(array))
        for axis in dynamic_axes.get(name, ()):
            shape[axis] = None
        input_shapes[name] = (shape, _input_dtype(array))
    model_bytes = convert_model_to_tflite(
        model, input_shapes, quantize=quantize, representative_data=representative_data
    )
    ops = tflite_ops(model_bytes)
    assert_builtin_only(ops)
    outputs, expected = [], []
    for feed in [inputs, *extra_inputs]:
        feed = {k: _as_feed_array(v) for k, v in feed.items()}
        keras_out = [
            keras.ops.convert_to_numpy(t)
            for t in flatten_outputs(model(_feed_for_model(model, feed), training=False))
        ]
        lite_out = run_tflite(model_bytes, feed)
        assert len(lite_out) == len(keras_out), (
            f"TFLite returned {len(lite_out)} outputs, Keras {len(keras_out)}"
        )
        outputs.extend(lite_out)
        expected.extend(keras_out)
    return TFLiteResult(outputs, expected, ops, model_bytes)


# --------------------------------------------------------------------------
# run_layer_test
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _stage(layer_name, stage):
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"[{layer_name}] stage '{stage}' failed: {error}") from error
    except Exception as error:  # any error in a stage is a test failure
        raise AssertionError(
            f"[{layer_name}] stage '{stage}' failed with {type(error).__name__}: {error}"
        ) from error


def _shape_tuple(shape):
    return tuple(None if d is None else int(d) for d in shape)


def _normalize_shapes(shapes):
    """A shape or a (nested) list of shapes -> list of shape tuples."""
    if isinstance(shapes, dict):
        return [_shape_tuple(shapes[k]) for k in sorted(shapes)]
    shapes = list(shapes)
    if all(d is None or isinstance(d, (int, np.integer)) for d in shapes):
        return [_shape_tuple(shapes)]
    flat = []
    for item in shapes:
        flat.extend(_normalize_shapes(item))
    return flat


def _float_like(array):
    dtype = keras.backend.standardize_dtype(array.dtype)
    return "float" in dtype


def _to_numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _max_err(a, b):
    a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _set_mask(tensor, mask):
    try:
        from keras.src.backend.common.masking import set_keras_mask
    except ImportError:  # older/newer Keras: the attribute is the contract
        setattr(tensor, "_keras_mask", mask)
    else:
        set_keras_mask(tensor, mask)


def _get_mask(tensor):
    try:
        from keras.src.backend.common.masking import get_keras_mask
    except ImportError:
        return getattr(tensor, "_keras_mask", None)
    return get_keras_mask(tensor)


class _LayerCase:
    """Holds the inputs of one run_layer_test call and calls layers on them."""

    def __init__(self, layer_cls, init_kwargs, input_data, call_kwargs, dynamic_axes):
        self.layer_cls = layer_cls
        self.init_kwargs = dict(init_kwargs or {})
        self.call_kwargs = dict(call_kwargs or {})
        self.single = not isinstance(input_data, dict)
        if self.single:
            self.inputs = {"inputs": _as_feed_array(input_data)}
        else:
            if not input_data:
                raise ValueError("`input_data` dict is empty.")
            self.inputs = {k: _as_feed_array(v) for k, v in input_data.items()}
        self.dynamic_axes = {}
        for name, array in self.inputs.items():
            if dynamic_axes and name in dynamic_axes:
                self.dynamic_axes[name] = tuple(dynamic_axes[name])
            else:
                self.dynamic_axes[name] = (0, 1) if array.ndim >= 2 else (0,)

    def make(self, **overrides):
        return self.layer_cls(**{**self.init_kwargs, **overrides})

    def call(self, layer, tensors, **extra):
        kwargs = {**self.call_kwargs, **extra}
        if self.single:
            return layer(tensors["inputs"], **kwargs)
        return layer(**tensors, **kwargs)

    def eager_tensors(self):
        return {k: keras.ops.convert_to_tensor(v) for k, v in self.inputs.items()}

    def symbolic_inputs(self, static=False, batch_dynamic=True):
        symbolic = {}
        for name, array in self.inputs.items():
            shape = list(array.shape)
            if not static:
                for axis in self.dynamic_axes[name]:
                    shape[axis] = None
            symbolic[name] = keras.Input(
                shape=tuple(shape[1:]),
                batch_size=None if (batch_dynamic and not static) else shape[0],
                dtype=_input_dtype(array),
                name=name,
            )
        return symbolic

    def functional(self, layer, static=False):
        symbolic = self.symbolic_inputs(static=static)
        outputs = self.call(layer, symbolic)
        model_inputs = symbolic["inputs"] if self.single else symbolic
        return keras.Model(model_inputs, outputs)

    def model_feed(self):
        return self.inputs["inputs"] if self.single else dict(self.inputs)

    def compute_output_shape(self, layer, shapes):
        method = layer.compute_output_shape
        params = inspect.signature(method).parameters
        extra = {k: v for k, v in self.call_kwargs.items() if k in params}
        if self.single:
            return method(shapes["inputs"], **extra)
        return method(**{f"{k}_shape": s for k, s in shapes.items()}, **extra)


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    *,
    call_kwargs=None,
    expected_output_shape=None,
    input_mask=None,
    supports_masking=False,
    run_training=True,
    run_mixed_precision=True,
    run_tflite=True,
    tflite_atol=1e-5,
    tflite_static_and_dynamic=True,
    dynamic_axes=None,
    mixed_precision_atol=None,
):
    """Runs the project's standard checks on one layer class.

    Args:
        layer_cls: the layer class (registered serializable).
        init_kwargs: dict of constructor arguments.
        input_data: a NumPy array (the single positional input) or a dict
            {call argument name: array}, e.g. {"query": q, "value": v}. Integer
            arrays become int32 inputs, floats float32, bools bool.
        call_kwargs: non-tensor call arguments (Python values), e.g.
            {"start_index": 3}. Tensors belong in `input_data`. Those that
            `compute_output_shape` accepts are passed to it too.
        expected_output_shape: shape tuple, or a list of them for layers
            returning several tensors (a dict output is ordered by key).
        input_mask: bool array [batch, sequence] attached to the single input
            (or a dict {input name: mask}); the output mask must equal the
            first input's mask when `supports_masking`.
        supports_masking: whether the layer passes masks through.
        run_training, run_mixed_precision, run_tflite: enable those stages.
        tflite_atol: max abs difference TFLite vs Keras.
        tflite_static_and_dynamic: also convert with dynamic batch and
            sequence; `False` checks the static-shape model only (for layers
            that need static lengths, e.g. causal masks, docs/facts.md).
        dynamic_axes: {input name: axes} made `None` in the symbolic and
            dynamic-TFLite stages; default: batch and axis 1.
        mixed_precision_atol: {policy: tolerance} overriding
            `MIXED_PRECISION_ATOL` (relative to max(1, max |float32 output|)).

    Returns:
        The layer built in the eager stage.

    Example:

    ```python
    run_layer_test(
        keras.layers.Dense, {"units": 3}, np.ones((2, 4, 5), "float32"),
        expected_output_shape=(2, 4, 3), supports_masking=True,
        input_mask=np.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool))
    ```
    """
    case = _LayerCase(layer_cls, init_kwargs, input_data, call_kwargs, dynamic_axes)
    name = getattr(layer_cls, "__name__", str(layer_cls))
    shapes = {k: v.shape for k, v in case.inputs.items()}

    with _stage(name, "eager"):
        layer = case.make()
        outputs = flatten_outputs(case.call(layer, case.eager_tensors()))
        reference = [_to_numpy(t) for t in outputs]
        actual_shapes = [tuple(r.shape) for r in reference]
        if expected_output_shape is not None:
            expected = _normalize_shapes(expected_output_shape)
            assert actual_shapes == expected, (
                f"output shapes {actual_shapes} != expected_output_shape {expected}"
            )
        computed = _normalize_shapes(case.compute_output_shape(layer, shapes))
        assert computed == actual_shapes, (
            f"compute_output_shape gives {computed}, eager outputs {actual_shapes}"
        )
        for r in reference:
            if _float_like(r):
                assert np.all(np.isfinite(r)), "eager output is not finite"

    with _stage(name, "symbolic"):
        fresh = case.make()
        symbolic = case.symbolic_inputs()
        sym_outputs = flatten_outputs(case.call(fresh, symbolic))
        sym_shapes = [_shape_tuple(t.shape) for t in sym_outputs]
        sym_input_shapes = {k: _shape_tuple(v.shape) for k, v in symbolic.items()}
        computed = _normalize_shapes(case.compute_output_shape(fresh, sym_input_shapes))
        assert computed == sym_shapes, (
            f"compute_output_shape{sym_input_shapes} gives {computed}, "
            f"symbolic outputs {sym_shapes}"
        )
        assert len(sym_shapes) == len(actual_shapes), (
            f"{len(sym_shapes)} symbolic outputs vs {len(actual_shapes)} eager"
        )
        for sym, real in zip(sym_shapes, actual_shapes):
            assert len(sym) == len(real) and all(s is None or s == r for s, r in zip(sym, real)), (
                f"symbolic shape {sym} does not match eager shape {real}"
            )

    with _stage(name, "config"):
        config = layer.get_config()
        json.dumps(config)
        clone = layer_cls.from_config(config)
        assert clone.get_config() == config, (
            f"from_config(get_config()).get_config() differs:\n{clone.get_config()}\n!=\n{config}"
        )
        case.call(clone, case.eager_tensors())
        clone.set_weights(layer.get_weights())
        clone_out = [_to_numpy(t) for t in flatten_outputs(case.call(clone, case.eager_tensors()))]
        for got, want in zip(clone_out, reference):
            assert _max_err(got, want) <= 1e-6, (
                f"from_config clone differs by {_max_err(got, want)}"
            )

    model = None
    with _stage(name, "saving"):
        model = case.functional(layer)
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "model.keras")
            model.save(path)
            loaded = keras.saving.load_model(path, safe_mode=True)
        want = [_to_numpy(t) for t in flatten_outputs(model(case.model_feed()))]
        got = [_to_numpy(t) for t in flatten_outputs(loaded(case.model_feed()))]
        assert len(got) == len(want), "loaded model returns a different number of outputs"
        for g, w in zip(got, want):
            assert _max_err(g, w) <= 1e-6, f"loaded model differs by {_max_err(g, w)}"

    if run_training and layer.trainable_weights:
        with _stage(name, "training"):
            rng = np.random.default_rng(0)
            targets = [rng.normal(size=r.shape).astype("float32") for r in reference]
            train_model = case.functional(case.make())
            train_model.compile(
                optimizer=keras.optimizers.Adam(1e-2),
                loss=["mse"] * len(targets) if len(targets) > 1 else "mse",
                jit_compile=False,
            )
            train_model(case.model_feed())
            before = [np.array(w.numpy()) for w in train_model.trainable_weights]
            assert before, "the training model has no trainable weights"
            loss = train_model.train_on_batch(
                case.model_feed(), targets if len(targets) > 1 else targets[0]
            )
            loss = np.asarray(loss, "float64")
            assert np.all(np.isfinite(loss)), f"training loss is not finite: {loss}"
            after = [np.array(w.numpy()) for w in train_model.trainable_weights]
            assert any(not np.array_equal(b, a) for b, a in zip(before, after)), (
                "no trainable weight changed after one training step"
            )

    if run_mixed_precision:
        tolerances = {**MIXED_PRECISION_ATOL, **(mixed_precision_atol or {})}
        for policy in ("mixed_float16", "mixed_bfloat16"):
            with _stage(name, f"mixed_precision[{policy}]"):
                mixed = case.make(dtype=policy)
                compute_dtype = keras.dtype_policies.get(policy).compute_dtype
                case.call(mixed, case.eager_tensors())
                mixed.set_weights(layer.get_weights())
                for variable in mixed.weights:
                    dtype = keras.backend.standardize_dtype(variable.dtype)
                    if "float" in dtype:
                        assert dtype == "float32", (
                            f"variable {variable.path} is {dtype}, not float32"
                        )
                mixed_out = flatten_outputs(case.call(mixed, case.eager_tensors()))
                for i, (out, ref) in enumerate(zip(mixed_out, reference)):
                    if not _float_like(ref):
                        continue
                    dtype = keras.backend.standardize_dtype(out.dtype)
                    assert dtype == compute_dtype, (
                        f"output {i} is {dtype}, expected {compute_dtype}"
                    )
                    value = _to_numpy(keras.ops.cast(out, "float32"))
                    assert np.all(np.isfinite(value)), f"output {i} is not finite"
                    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
                    err = _max_err(value, ref)
                    assert err <= tolerances[policy] * scale, (
                        f"output {i} differs from float32 by {err} "
                        f"(> {tolerances[policy]} * {scale})"
                    )

    if input_mask is not None:
        with _stage(name, "masking"):
            masks = (
                input_mask
                if isinstance(input_mask, dict)
                else {next(iter(case.inputs)): input_mask}
            )
            tensors = case.eager_tensors()
            for key, mask in masks.items():
                _set_mask(tensors[key], keras.ops.convert_to_tensor(np.asarray(mask, bool)))
            masked_out = flatten_outputs(case.call(layer, tensors))
            if supports_masking:
                assert layer.supports_masking, (
                    "supports_masking=True was expected but layer.supports_masking is False"
                )
                out_mask = _get_mask(masked_out[0])
                assert out_mask is not None, "the output carries no mask"
                expected_mask = np.asarray(next(iter(masks.values())), bool)
                got_mask = _to_numpy(out_mask).astype(bool)
                assert got_mask.shape == expected_mask.shape and np.array_equal(
                    got_mask, expected_mask
                ), f"output mask {got_mask.tolist()} != input mask {expected_mask.tolist()}"

    if run_tflite:
        variants = [("tflite_static", True)]
        if tflite_static_and_dynamic:
            variants.append(("tflite_dynamic", False))
        for stage, static in variants:
            with _stage(name, stage):
                lite_model = case.functional(layer, static=static)
                extra = []
                if not static:
                    # Resize to batch 1 as well: proves the dims are dynamic.
                    extra = [{k: v[:1] for k, v in case.inputs.items()}]
                result = tflite_convert_and_run(
                    lite_model,
                    dict(case.inputs),
                    dynamic_axes=None if static else case.dynamic_axes,
                    extra_inputs=extra,
                )
                assert result.max_abs_diff <= tflite_atol, (
                    f"TFLite differs from Keras by {result.max_abs_diff} "
                    f"(> tflite_atol={tflite_atol}); ops: {result.ops}"
                )
    return layer
