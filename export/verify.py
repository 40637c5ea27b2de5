"""verify: the same inputs through Keras, the SavedModel and LiteRT.

The SavedModel runs in a fresh Python process that never imports this
project (as TF Serving sees it); the process checks that itself.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

from export import accelerator, check, kinds, rundir
from export.errors import ExportError
from export.tflite import gates
from zoo import litert as runtime
from zoo.cli import UsageError
from zoo.rundir import load_json, saved_model_version_dir

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
    found = saved_model_version_dir(path)
    if found is None:
        raise UsageError(f"not a SavedModel or TF Serving model directory: {path}")
    return found


def sidecar(tflite):
    """FILE.tflite's sidecar FILE.tflite.json as a dict ({} when it has none)."""
    path = runtime.sidecar_path(tflite)
    return load_json(path, "sidecar file ") if os.path.exists(path) else {}


def tflite_specs(details):
    """TensorSpecs (batch left free) of a LiteRT signature's inputs."""
    import tensorflow as tf

    return [
        tf.TensorSpec(
            [None] + [None if int(x) < 0 else int(x) for x in d["shape_signature"][1:]],
            d["dtype"],
            name=k,
        )
        for k, d in details.items()
    ]


def run_savedmodel_clean(saved_dir, inputs, signature):
    """Calls `signature` of `saved_dir` in a fresh process without the project."""
    with tempfile.TemporaryDirectory(prefix="export-verify-") as tmp:
        in_path, out_path = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(in_path, **inputs)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        proc = subprocess.run(
            [
                sys.executable,
                "-I",
                "-c",
                _CHILD,
                in_path,
                os.path.abspath(saved_dir),
                signature,
                out_path,
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise ExportError(
                f"SavedModel signature {signature!r} failed in a clean process: {tail}"
            )
        with np.load(out_path) as data:
            return {k: data[k] for k in data.files}


def verify(run_dir, savedmodel=None, tflite=None, samples=64):
    """Returns a report dict comparing Keras with the given exports."""
    if savedmodel is None and tflite is None:
        raise UsageError("verify needs --savedmodel and/or --tflite")
    src = rundir.resolve(run_dir).held_out()
    kind = kinds.get(src.kind)
    fn = kind.core_fn(src)  # refuses a model of another kind

    specs = kind.core_specs(src)

    report = {"source": src.path, "kind": kind.name, "rows_from": src.sample_file}
    inputs = kind.sample_inputs(src, samples, specs=specs)
    want = kinds.run_core(fn, specs, inputs)
    float_metric = kind.metric(src, inputs, want)
    report["keras"] = {"metric": float_metric}
    if savedmodel is not None:
        saved_dir = resolve_version_dir(savedmodel)
        got = run_savedmodel_clean(saved_dir, inputs, kind.id_signature)
        got = {kind.id_outputs.get(name, name): value for name, value in got.items()}
        entry = {
            "path": saved_dir,
            "signature": kind.id_signature,
            **runtime.compare(want, got, kind.valid_mask(inputs), kind.class_output),
        }
        # The same graph in TensorFlow: the float gates.
        report["savedmodel"] = _verdict(entry, inputs, "none")
    if tflite is not None:
        if not os.path.isfile(tflite):
            raise UsageError(f"no such .tflite file: {tflite}")
        runner, _ = runtime.signature_runner(runtime.interpreter(tflite))
        # A static-shape model sees the inputs padded / cut to its length;
        # Keras gets the same fitted inputs so both answer the same question.
        tspecs = tflite_specs(runner.get_input_details())
        t_inputs = {s.name: kinds.fit_to_spec(inputs[s.name], s) for s in tspecs}
        t_want = kinds.run_core(fn, specs, t_inputs)
        got = runtime.run(tflite, t_inputs)
        entry = {
            "path": tflite,
            "quantize": sidecar(tflite).get("quantize"),
            **runtime.compare(t_want, got, kind.valid_mask(t_inputs), kind.class_output),
        }
        entry["metric"] = kind.metric(src, t_inputs, got)
        entry["float_metric_same_inputs"] = kind.metric(src, t_inputs, t_want)
        report["tflite"] = _verdict(entry, t_inputs, entry["quantize"] or "none")
    report["ok"] = all(report[k]["ok"] for k in ("savedmodel", "tflite") if k in report)
    return report


def _verdict(entry, inputs, quantize):
    """`entry` with its verdict by `export tflite`'s gates for `quantize`: every
    output present, compared, finite and within them."""
    fails = gates(entry, inputs, quantize)
    entry.update(fails=fails, ok=not fails)
    return entry


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
        lines.append(f"  {key:<11} max abs diff {diffs or '-'}{agree}  [{e['path']}]")
        if e.get("metric"):
            name, value = e["metric"]
            fname, fvalue = e["float_metric_same_inputs"]
            lines.append(
                f"  {'':<11} {name} {value:.4f} ({e.get('quantize')}) vs float {fvalue:.4f}"
            )
        lines.append(f"  {'':<11} " + ("PASS" if e["ok"] else "FAIL: " + "; ".join(e["fails"])))
    lines.append("  verdict: " + ("PASS" if report["ok"] else "FAIL"))
    return "\n".join(lines)


# ---------------------------------------------------------------- real accelerator
def _accelerator_target(target, tflite):
    """(.tflite path, run dir or None) from `verify RUN_OR_FILE [--tflite F]`."""
    path = tflite
    run = None
    if path is None:
        if not target.endswith(".tflite"):
            raise UsageError(
                f"--accelerator needs a .tflite file: name it, or a run with --tflite FILE (got {target})"
            )
        path = target
    elif os.path.isdir(target):
        run = target
    if not os.path.isfile(path):
        raise UsageError(f"no such .tflite file: {path}")
    runtime.check_tflite_file(path)
    if run is None:
        for side in (
            runtime.sidecar_path(path),
            runtime.seq2seq_sidecar_path(os.path.dirname(path)),
        ):
            if os.path.exists(side):
                source = load_json(side, "sidecar file ").get("source")
                if source and os.path.exists(source):
                    run = source
                break
    return path, run


def _rows(details, src, kind, n):
    """n batch-1 rows for one signature (its LiteRT input details): the run's
    calibration / test rows when there is a run, synthetic ones otherwise
    (ExportKind.sample_inputs)."""
    import tensorflow as tf

    specs = [tf.TensorSpec([None, *d["shape"][1:]], d["dtype"], name=k) for k, d in details.items()]
    inputs = (kind or kinds.get("keras")).sample_inputs(src or rundir.Source("", "keras"), n, specs)
    inputs = {s.name: kinds.fit_to_spec(inputs[s.name], s) for s in specs}
    count = min(len(v) for v in inputs.values())
    return [
        {k: v[i : i + 1].reshape(details[k]["shape"]) for k, v in inputs.items()}
        for i in range(count)
    ]


def _seq2seq_rows(steps, kind, src, n):
    """n source rows for the step model `steps` (a `zoo.litert.StepModel`): the
    run's, else random ids."""
    source_len = steps.max_source_length
    if src is not None:
        import tensorflow as tf

        spec = tf.TensorSpec([None, source_len], tf.int32, name="source_ids")
        return kinds.fit_to_spec(kind.sample_inputs(src, n, specs=[spec])["source_ids"], spec)
    rng = np.random.default_rng(0)
    rows = np.zeros((n, source_len), np.int32)
    for r in rows:
        k = int(rng.integers(2, max(3, source_len // 2)))
        r[:k] = rng.integers(4, max(5, steps.vocabulary_size), size=k)
    return rows


def verify_accelerator(target, tflite=None, samples=8, runs=20):
    """LiteRT's real GPU accelerator vs its CPU runtime on one .tflite.

    The static check runs first and always. Without a Vulkan device the report
    says so (`no_device`) and stops there. Otherwise, in a child process without
    TensorFlow (export/accelerator.py): the file compiled with the GPU
    accelerator only, `is_fully_accelerated()`, every signature's outputs on the
    run's rows (synthetic ones without a run) against LiteRT's CPU, latency with
    a read of an output inside the timed loop; seq2seq `encode` / `decode_step`
    files also run the whole greedy loop on both and must give the same tokens."""
    path, run = _accelerator_target(target, tflite)
    report = {
        "path": path,
        "accelerator": "gpu",
        "source": run,
        "static_problems": [str(p) for p in check.check_file(path, "gpu")],
    }
    problem = accelerator.device_problem()
    if problem:
        report["no_device"] = problem
        return report
    src = rundir.resolve(run).held_out() if run else None
    kind = kinds.get(src.kind) if src else None
    interp = runtime.interpreter(path)
    greedy = None
    if {"encode", "decode_step"} <= set(interp.get_signature_list()):
        from export.kinds.seq2seq import first_step

        steps = runtime.StepModel.from_interpreter(interp)
        rows = _seq2seq_rows(steps, kind, src, samples)
        first = interp.get_signature_runner("encode")(source_ids=rows[:1])
        feeds = {
            "encode": [{"source_ids": r[None]} for r in rows],
            "decode_step": [first_step(first, steps.cache_shape)],
        }
        greedy = {"rows": [r[None] for r in rows], "length": steps.max_target_length}
    else:
        feeds = {
            sig: _rows(interp.get_signature_runner(sig).get_input_details(), src, kind, samples)
            for sig in interp.get_signature_list()
        }
    result = accelerator.run_many_in_child([(path, feeds, greedy, runs)], f32=True)[0]
    if not result["crashed"] and not result["cpu"].get("compiled"):
        raise ExportError(f"LiteRT's CPU runtime cannot run {path}: {result['cpu'].get('error')}")
    class_output = kind.class_output if kind and not greedy else None
    masks = class_output and {s: kind.valid_mask(accelerator.stack(r)) for s, r in feeds.items()}
    report.update(accelerator.judge(result, feeds, 0.95, class_output, masks))
    if not report["compiled"]:
        return report
    gpu, cpu, f32 = result["gpu"], result["cpu"], result.get("gpu_f32") or {}
    for sig, entry in report["signatures"].items():
        entry["gpu_latency"] = gpu["latency"].get(sig)
        entry["cpu_latency"] = cpu["latency"].get(sig)
        f32_rows = (f32.get("outputs") or {}).get(sig) or []
        if entry["ok"] and not f32.get("run_error") and len(f32_rows) == entry["rows"]:
            # The same GPU computing in float32: a gap that vanishes here is precision.
            entry["max_abs_diff_gpu_f32"] = runtime.compare(
                accelerator.stack(cpu["outputs"][sig]), accelerator.stack(f32_rows)
            )["max_abs_diff"]
    if greedy:
        # A row whose tokens part where CPU's best two logits are nearer than the
        # GPU's measured logits error is a near tie (precision), not a wrong op;
        # it is counted apart and does not fail the verdict.
        tie = max(
            report["signatures"]["decode_step"]["tolerance"].get("logits", 0.02),
            2 * report["signatures"]["decode_step"]["max_abs_diff"].get("logits", 0.0),
        )
        mismatches = []
        cpu_greedy, gpu_greedy = cpu.get("greedy") or [], gpu.get("greedy") or []
        for i, (a, b) in enumerate(zip(cpu_greedy, gpu_greedy)):
            if a == b:
                continue
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            margin = cpu["margins"][i][k] if k < len(cpu["margins"][i]) else float("inf")
            mismatches.append(
                {
                    "row": i,
                    "step": k,
                    "cpu_margin": margin,
                    "near_tie": margin <= tie,
                    "cpu": a[max(0, k - 2) : k + 4],
                    "gpu": b[max(0, k - 2) : k + 4],
                }
            )
        fed, ties = len(greedy["rows"]), sum(m["near_tie"] for m in mismatches)
        same = min(len(cpu_greedy), len(gpu_greedy)) - len(mismatches)
        report["signatures"]["greedy"] = {
            "rows": fed,
            "same_tokens": same,
            "near_ties": ties,
            "tie_margin": tie,
            "ok": len(mismatches) == ties and fed > 0 and len(cpu_greedy) == len(gpu_greedy) == fed,
            "mismatches": mismatches[:3],
        }
        report["ok"] = report["ok"] and report["signatures"]["greedy"]["ok"]
    return report


def format_accelerator_report(report):
    lines = [
        f"verify {report['path']} on LiteRT's GPU accelerator"
        + (f" (rows from {report['source']})" if report.get("source") else " (synthetic rows)")
    ]
    static = report["static_problems"]
    first = static[0].splitlines()[0] if static else ""
    lines.append(
        "  static check --target gpu: "
        + (f"NOT compatible ({len(static)} problems; first: {first})" if static else "compatible")
    )
    if "no_device" in report:
        lines.append("  " + report["no_device"])
        return "\n".join(lines)
    if not report["compiled"]:
        lines.append(f"  gpu: {report['error']}")
        lines.append("  verdict: FAIL (does not compile for the GPU accelerator alone)")
        return "\n".join(lines)
    lines.append(
        "  gpu: compiled with the GPU accelerator only; "
        + ("fully accelerated" if report["fully_accelerated"] else "NOT fully accelerated")
    )
    for line in report.get("delegate_log") or []:
        lines.append(f"  delegate: {line}")
    for line in report.get("run_errors") or []:
        lines.append(f"  run error: {line}")
    for sig, e in report["signatures"].items():
        if sig == "greedy":
            lines.append(
                f"  greedy loop (encode + decode_step per token): {e['same_tokens']}/{e['rows']} rows "
                "with CPU's tokens"
                + (
                    f", {e['near_ties']} parting at a near tie (CPU's top-2 logits "
                    f"within {e['tie_margin']:.2g})"
                    if e["near_ties"]
                    else ""
                )
                + "".join(
                    f"; row {m['row']} parts at step {m['step']} (CPU margin {m['cpu_margin']:.3g}): "
                    f"cpu ...{m['cpu']} gpu ...{m['gpu']}"
                    for m in e["mismatches"]
                )
            )
            continue
        diffs = ", ".join(
            f"{k} {v:.3g} (tol {e['tolerance'][k]:.2g})" for k, v in e["max_abs_diff"].items()
        )
        agree = "" if e["agreement"] is None else f"; argmax agreement {e['agreement']:.2%}"
        exact = "".join(f"; {k} equal {v:.2%}" for k, v in e.get("equal_fraction", {}).items())
        if e.get("max_abs_diff_gpu_f32"):
            f32 = ", ".join(f"{v:.2g}" for v in e["max_abs_diff_gpu_f32"].values())
            diffs += f" [GPU in float32: {f32}]"
        lines.append(
            f"  {sig}: {e['rows']} rows, max abs diff vs CPU {diffs or '-'}{agree}{exact}; "
            + (
                f"p50 gpu {e['gpu_latency']['p50_ms']:.3f} ms, cpu {e['cpu_latency']['p50_ms']:.3f} ms"
                if e.get("gpu_latency") and e.get("cpu_latency")
                else "untimed"
            )
            + "".join(f"; FAIL: {why}" for why in e.get("fails", []))
        )
    lines.append("  verdict: " + ("PASS" if report["ok"] else "FAIL"))
    return "\n".join(lines)
