"""Running .tflite files with LiteRT (ai-edge-litert and NumPy only: no TensorFlow):
the interpreter behind one file check, signature runners and comparisons."""

import numpy as np


def interpreter(model, threads=None):
    """An ai_edge_litert Interpreter from a path or the model's bytes."""
    from ai_edge_litert.interpreter import Interpreter

    kwargs = {"num_threads": threads} if threads else {}
    if isinstance(model, (bytes, bytearray)):
        return Interpreter(model_content=bytes(model), **kwargs)
    check_tflite_file(str(model))
    try:
        return Interpreter(model_path=str(model), **kwargs)
    except (ValueError, RuntimeError) as e:
        from zoo.cli import UsageError

        raise UsageError(
            f"cannot load .tflite file {model}: {' '.join(str(e).split())[:200]}"
        ) from None


def check_tflite_file(path):
    # LiteRT answers a truncated or foreign file with a multi-line error (or worse).
    from zoo.cli import UsageError

    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise UsageError(f"cannot read .tflite file {path}: {e.strerror}") from None
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise UsageError(
            f"not a TFLite model (no TFL3 identifier; truncated or corrupted?): {path}"
        )


def signature_runner(interp, signature=None):
    signatures = interp.get_signature_list()
    if not signatures:
        raise ValueError("the .tflite model has no signatures")
    if signature is None:
        signature = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    return interp.get_signature_runner(signature), signature


def input_details(runner):
    return runner.get_input_details()


def run(model, inputs, signature=None, threads=None):
    """Runs `inputs` (dict name -> array with a batch axis) through LiteRT.

    A static batch-1 model runs row by row; a dynamic one runs the batch at once.
    Returns a dict name -> array with the batch axis of `inputs`.
    """
    interp = interpreter(model, threads)
    runner, _ = signature_runner(interp, signature)
    details = runner.get_input_details()
    batch = len(next(iter(inputs.values())))
    static_one = all(
        list(d.get("shape_signature", d["shape"]))[:1] == [1] for d in details.values()
    )
    if static_one and batch != 1:
        parts = [
            runner(**{k: np.asarray(v[i : i + 1]) for k, v in inputs.items()}) for i in range(batch)
        ]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return {
        k: np.asarray(v) for k, v in runner(**{k: np.asarray(v) for k, v in inputs.items()}).items()
    }


def compare(reference, candidate, mask=None, class_output=None):
    """Max abs diff per output, and argmax agreement on `class_output`.

    Args:
        reference, candidate: dict name -> array (same shapes).
        mask: optional bool array over the leading axes ([B, T]) of positions
            that count (padding is excluded).
        class_output: name of the output whose last axis holds class scores.
    """
    report = {"max_abs_diff": {}, "agreement": None}
    for name, ref in reference.items():
        if name not in candidate:
            continue
        if not np.issubdtype(np.asarray(ref).dtype, np.floating):
            continue  # class ids: argmax agreement speaks for them
        a = np.asarray(ref, dtype=np.float64)
        b = np.asarray(candidate[name], dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"output {name!r}: shape {b.shape} != Keras {a.shape}")
        diff = np.abs(a - b)
        if mask is not None and diff.ndim >= mask.ndim and diff.shape[: mask.ndim] == mask.shape:
            diff = diff[mask]
        report["max_abs_diff"][name] = float(diff.max()) if diff.size else 0.0
    if class_output and class_output in candidate:
        ra = np.argmax(reference[class_output], axis=-1)
        ca = np.argmax(candidate[class_output], axis=-1)
        same = ra == ca
        if mask is not None and same.shape == mask.shape:
            same = same[mask]
        report["agreement"] = float(same.mean()) if same.size else 1.0
    return report
