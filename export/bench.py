"""bench: latency percentiles at batch 1 and 32, LiteRT (or SavedModel) vs Keras."""

import os

import numpy as np

from export import accelerator, kinds, rundir, verify
from zoo import litert as runtime
from zoo.cli import UsageError

BATCHES = (1, 32)


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _batch(inputs, b):
    """b rows: the inputs' rows, repeated as often as needed."""
    return {k: np.resize(v, (b, *v.shape[1:])) for k, v in inputs.items()}


def bench(target, run_dir=None, threads=None, runs=50, warmup=5):
    """Returns {"size_bytes", "litert"|"savedmodel": {batch: stats}, "keras": {...}}."""
    import tensorflow as tf

    if not os.path.exists(target):
        raise UsageError(f"no such .tflite file or SavedModel: {target}")
    is_tflite = os.path.isfile(target)
    if is_tflite and not target.endswith(".tflite"):
        raise UsageError(f"not a .tflite file or SavedModel directory: {target}")
    run_dir = run_dir or (verify.sidecar(target).get("source") if is_tflite else None)
    src = rundir.resolve(run_dir) if run_dir and os.path.exists(run_dir) else None
    kind = kinds.get(src.kind if src else "keras")
    report = {"target": target, "size_bytes": _size(target), "threads": threads}

    if is_tflite:
        runner, _ = runtime.signature_runner(runtime.interpreter(target, threads))
        specs = verify.tflite_specs(runner.get_input_details())
    else:
        saved = verify.resolve_version_dir(target)
        loaded = tf.saved_model.load(saved)
        signature = loaded.signatures[kind.id_signature]
        specs = [
            tf.TensorSpec(s.shape, s.dtype, name=k)
            for k, s in signature.structured_input_signature[1].items()
        ]
        report["size_bytes"] = _size(saved)
    base = kind.sample_inputs(src or rundir.Source("", "keras"), 32, specs=specs)

    key = "litert" if is_tflite else "savedmodel"
    report[key] = {}
    for b in BATCHES:
        x = _batch(base, b)
        if is_tflite:  # a static batch-1 model runs row by row (litert.call)
            call = lambda x=x: runtime.call(runner, x)  # noqa: E731
        else:
            feed = {k: tf.constant(v) for k, v in x.items()}
            call = lambda feed=feed: signature(**feed)  # noqa: E731
        report[key][b] = accelerator.latency(call, runs, warmup)
    if src:
        core = kind.core(src)
        names = [s.name for s in specs]
        report["keras"] = {}
        for b in BATCHES:
            x = {k: tf.constant(v) for k, v in _batch(base, b).items()}
            arg = x[names[0]] if len(names) == 1 else x
            report["keras"][b] = accelerator.latency(
                lambda arg=arg: core(arg, training=False), runs, warmup
            )
    return report


def format_report(report):
    lines = [
        f"bench {report['target']}  size {report['size_bytes'] / 1e6:.3f} MB"
        + (f"  threads {report['threads']}" if report["threads"] else "")
    ]
    for key in ("litert", "savedmodel", "keras"):
        for b, s in report.get(key, {}).items():
            lines.append(
                f"  {key:<10} batch {b:>3}: p50 {s['p50_ms']:.3f} ms  p90 {s['p90_ms']:.3f} ms"
                f"  p99 {s['p99_ms']:.3f} ms"
            )
    if "keras" in report:
        key = "litert" if "litert" in report else "savedmodel"
        b = min(report[key])
        lines.append(
            f"  speed-up at batch {b}: {report['keras'][b]['p50_ms'] / report[key][b]['p50_ms']:.1f}x"
        )
    return "\n".join(lines)
