"""TFLite export: ExportArchive (export.savedmodel.write) -> SavedModel -> TFLiteConverter, builtin ops.

Every model is run in ai_edge_litert and compared with Keras before anything
is written (docs/facts.md: converted models can silently return zeros). The model,
its sidecar `FILE.tflite.json` (labels, vocab, input/output names) and the app
bundle beside them (export/bundle.py: `STEM.preprocessing.json`, `STEM.labels.txt`,
`STEM.model_card.json`, `STEM.MODEL_CARD.md`) are written atomically.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile

import numpy as np

from export import bundle, gpu_rewrite, kinds, rundir, savedmodel
from export.check import op_counts
from export.errors import ExportError
from zoo import atomic
from zoo import litert as runtime
from zoo import run_lock as runlock
from zoo.cli import UsageError

QUANTIZE = ("none", "fp16", "dynamic", "int8", "int16x8")
ENDPOINT = "serving_default"

# Gates for "the converted model matches Keras": (max abs diff, min argmax agreement).
# A full-int8 classifier is gated on agreement alone: its probabilities move in steps
# of 1/256 through every layer, so on a handful of low-margin tokens they can swing by
# more than any useful bound while the predicted classes stay the same (a trained
# tagger: max abs diff 0.3-0.45 at 99.7% agreement and -0.1 accuracy points).
TOLERANCES = {
    "none": (1e-4, 0.999),
    "fp16": (1e-2, 0.99),
    "dynamic": (0.25, 0.90),
    "int8": (0.35, 0.95),
    "int16x8": (0.1, 0.95),
}


@dataclasses.dataclass
class Result:
    path: str
    sidecar: str
    size_bytes: int
    report: dict


def from_functions(functions, tracked, quantize="none", representative=None):
    """TFLite bytes of `functions` ({signature: (fn, input specs)}; the variables and
    tables of `tracked`) through a temporary SavedModel (`export.savedmodel.write`):
    the one TFLiteConverter setup of every export, builtin ops only (no SELECT_TF_OPS),
    `quantize` one of QUANTIZE; an ExportError names the ops outside the builtins."""
    import tensorflow as tf

    workdir = tempfile.mkdtemp(prefix="export-savedmodel-")
    try:
        savedmodel.write(workdir, functions, tracked)
        conv = tf.lite.TFLiteConverter.from_saved_model(workdir, signature_keys=list(functions))
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize != "none":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantize == "fp16":
            conv.target_spec.supported_types = [tf.float16]
        elif quantize in ("int8", "int16x8"):
            conv.representative_dataset = representative
            ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if quantize == "int16x8":
            # Ops without a 16x8 kernel (the rotary SIN/COS, mask CASTs) stay float rather
            # than failing the conversion; `check --target int8` lists them.
            ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                tf.lite.OpsSet.TFLITE_BUILTINS,
            ]
        # No SELECT_TF_OPS: a Flex op must fail here, not on the phone.
        conv.target_spec.supported_ops = ops
        try:
            content = conv.convert()
        except Exception as e:  # ConverterError and friends carry the op names
            message = str(e)
            names = set(re.findall(r"\bFlex(\w+)", message))
            names |= set(re.findall(r"'?tf\.(\w+)'?\s*(?:op|\()", message))
            names |= set(re.findall(r"\btf\.(\w+)\b", message))
            if names:
                raise ExportError(
                    "model needs ops outside TFLite builtins: " + ", ".join(sorted(names))
                ) from e
            first = next((l for l in message.splitlines() if "error" in l.lower()), message[:300])
            raise ExportError(f"TFLite conversion failed: {first.strip()}") from e
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    custom = sorted(n for n in op_counts(content) if n.startswith(("Flex", "CUSTOM:")))
    if custom:
        raise ExportError("model contains non-builtin ops: " + ", ".join(custom))
    return content


def convert(src, quantize="none", static_length=None):
    """Converts the `rundir.Source` `src` to TFLite bytes. Returns (bytes, specs)."""
    kind = kinds.get(src.kind)
    static = static_length is not None
    specs = kind.core_specs(src, static_length=static_length)
    rows = None
    if quantize in ("int8", "int16x8"):
        if src.calibration() is None:
            raise UsageError(
                f"--quantize {quantize} needs RUN_DIR/calibration.npz (source: {src.path})"
            )
        calibration = kind.calibration_inputs(src, specs)
        rows = {s.name: kinds.fit_to_spec(calibration[s.name], s) for s in specs}

    def representative():
        n = len(next(iter(rows.values())))
        for i in range(n):
            yield {k: v[i : i + 1] for k, v in rows.items()}

    # Only the id-level core: tracking the whole model would carry its string
    # lookup tables (HASHTABLE ops) into the .tflite.
    functions = {ENDPOINT: (kind.core_fn(src, static=static), specs)}
    content = from_functions(functions, [kind.core(src)], quantize, representative)
    if static:
        # The GPU mode: low-rank elementwise operands reshaped for LiteRT's GPU
        # accelerator (export/gpu_rewrite.py; the same arithmetic).
        content = gpu_rewrite.legalize(content)
    return content, specs


def gates(report, inputs, quantize, tolerance=None, min_agreement=None):
    """Why `report` (`zoo.litert.compare`'s, on `inputs`) fails the gates for
    `quantize`, which it records ([] = it passes): TOLERANCES unless overridden, a
    full-int8 classifier on argmax agreement unless given a tolerance, and rows."""
    max_diff, agreement = TOLERANCES.get(quantize, TOLERANCES["none"])
    max_diff = max_diff if tolerance is None else tolerance
    agreement = agreement if min_agreement is None else min_agreement
    report.update(gate_max_abs_diff=max_diff, gate_agreement=agreement)
    why = runtime.gate(report, max_diff, agreement, quantize == "int8" and tolerance is None)
    if not len(next(iter(inputs.values()), ())):
        why.insert(0, "no sample inputs")
    return why


def proof(content, src, kind, specs, quantize, tolerance=None, min_agreement=None):
    """Runs the model in LiteRT and in Keras on 64 rows; raises if they differ."""
    inputs = kind.sample_inputs(src, 64, specs=specs)
    want = kinds.run_core(kind.core_fn(src, static=specs[0].shape[0] == 1), specs, inputs)
    got = runtime.run(content, inputs, signature=ENDPOINT)
    report = runtime.compare(
        want, got, mask=kind.valid_mask(inputs), class_output=kind.class_output
    )
    why = gates(report, inputs, quantize, tolerance, min_agreement)
    report.update(samples=len(next(iter(inputs.values()), ())))
    for name, value in want.items():
        if (
            name in got
            and np.issubdtype(value.dtype, np.floating)
            and np.ptp(value) > 1e-3
            and np.ptp(got[name]) == 0
        ):
            raise ExportError(
                f"LiteRT output {name!r} is constant while Keras's varies (broken conversion)"
            )
    by_agreement = quantize == "int8" and report["agreement"] is not None and tolerance is None
    report.update(gated_on="agreement" if by_agreement else "max_abs_diff and agreement")
    if why:
        raise ExportError(f"LiteRT differs from Keras: {'; '.join(why)} ({quantize})")
    return report


def export_tflite(
    source,
    out,
    quantize="none",
    static_shape=False,
    length=None,
    tolerance=None,
    min_agreement=None,
):
    """Exports RUN_DIR_OR_MODEL to a builtin-ops-only .tflite plus FILE.tflite.json.

    Args:
        source: run directory, .keras file or live keras.Model.
        out: the .tflite path.
        quantize: one of QUANTIZE.
        static_shape: batch 1 and a fixed length (for GPU / accelerators).
        length: the fixed length for --static-shape (default: the kind's).
        tolerance, min_agreement: override the parity gates.

    Returns:
        A `Result` (paths, size, parity report).
    """
    if quantize not in QUANTIZE:
        raise UsageError(f"unknown --quantize {quantize!r} (choose from {', '.join(QUANTIZE)})")
    out = os.path.abspath(os.fspath(out))
    if os.path.isdir(out):
        raise UsageError(f"--out is a directory: {out}")
    if not out.endswith(".tflite"):
        raise UsageError(f"--out must end in .tflite: {out}")
    runlock.check_writable_ancestor(out, "--out")
    runlock.refuse_if_held(os.path.dirname(out))
    src = rundir.resolve(source)
    kind = kinds.get(src.kind)
    kind.model(src)
    static_length = None
    if static_shape:
        static_length = length or kind.default_length(src)
        kind.check_static(src, static_length)
        # 0 = static although no length is needed (every dim already fixed).
        static_length = static_length or 0
    elif length is not None:
        raise UsageError("--length only applies with --static-shape")
    content, specs = convert(src, quantize, static_length)
    try:
        report = proof(
            content, src, kind, specs, quantize, tolerance=tolerance, min_agreement=min_agreement
        )
    except RuntimeError as e:
        if quantize == "int16x8" and not static_shape:
            # Seen: a dynamic-length RANGE (rotary positions) left in float beside int16
            # tensors fails LiteRT's prepare step; a static length folds it away.
            raise ExportError(
                f"the int16x8 model does not run in LiteRT ({str(e).splitlines()[0]}); "
                "retry with --static-shape"
            ) from None
        raise

    runner, _ = runtime.signature_runner(runtime.interpreter(content))

    def tensors(details):
        return {
            k: {
                "dtype": np.dtype(d["dtype"]).name,
                "shape": [int(x) for x in d.get("shape_signature", d["shape"])],
            }
            for k, d in details.items()
        }

    sidecar = dict(kind.sidecar(src, static_length=static_length))
    sidecar.update(
        inputs=tensors(runner.get_input_details()),
        outputs=tensors(runner.get_output_details()),
        signature=ENDPOINT,
        quantize=quantize,
        static_shape=bool(static_shape),
        parity=report,
        source=os.path.abspath(src.path) if src.run_dir or os.path.exists(src.path) else None,
    )
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the directory of --out {out}: {e.strerror}") from None
    sidecar_path = runtime.sidecar_path(out)
    # The app bundle (export/bundle.py), its names prefixed with the file's stem;
    # the vocabularies stay in the sidecar, which the spec points to.
    extras = bundle.files(
        src,
        kind,
        "tflite",
        [os.path.basename(out), os.path.basename(sidecar_path)],
        prefix=os.path.basename(out)[: -len(".tflite")] + ".",
        quantize=quantize,
        parity=report,
        refs={"vocab": os.path.basename(sidecar_path)},
    )
    files = {out: content, sidecar_path: (json.dumps(sidecar, indent=2) + "\n").encode()}
    files.update((os.path.join(os.path.dirname(out), name), data) for name, data in extras.items())
    with runlock.locked(os.path.dirname(out)):
        atomic.clean_stale(os.path.dirname(out))
        # Every file is complete under a temporary name before any is renamed
        # into place; a failure before the renames changes nothing.
        with contextlib.ExitStack() as stack:
            for path, data in files.items():
                with open(stack.enter_context(atomic.building(path)), "wb") as f:
                    f.write(data)
    return Result(out, sidecar_path, len(content), report)
