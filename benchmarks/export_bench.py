"""Export targets for a trained tagger, measured (never asserted in tests).

    python -m benchmarks.export_bench RUN_DIR [--out DIR] [--threads N] [--runs N]

Targets:
- fp16 within 1e-3 of float (max abs diff of the probabilities, real tokens);
- int8 and dynamic at most 1/3 of the float size and within 0.5 accuracy
  points of float on the run's held-out test rows (evaluation.npz; the
  calibration sample for runs without one);
- LiteRT batch-1 latency at most 1/3 of Keras `model(x)` latency;
- the static-shape export passes `check --target gpu`;
- the static-shape int8 export passes `check --target int8` (integers only).
Prints one table and writes DIR/export_bench.json.
"""

import argparse
import json
import os
import sys
import tempfile


def _static_check(run_dir, out, quantize, target):
    """Problems `check --target TARGET` finds in the static-shape export (or why the
    export failed)."""
    from export import check, tflite

    path = os.path.join(out, f"tagger-static-{quantize}.tflite")
    try:
        tflite.export_tflite(run_dir, path, quantize=quantize, static_shape=True)
        return [str(p) for p in check.check_file(path, target)]
    except Exception as e:  # a failed export is a result too
        return [f"export failed: {e}"]


def main(argv=None):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser(prog="python -m benchmarks.export_bench")
    p.add_argument("run_dir")
    p.add_argument(
        "--out", help="directory for the exports and the JSON report (default: a temp dir)"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--samples", type=int, default=200)
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.run_dir, "config.json")):
        print(f"error: not a run directory: {args.run_dir}", file=sys.stderr)
        return 2

    from export import bench, tflite, verify

    out = args.out or tempfile.mkdtemp(prefix="export-bench-")
    os.makedirs(out, exist_ok=True)
    rows, results = [], {}
    for mode in ("none", "fp16", "dynamic", "int8"):
        path = os.path.join(out, f"tagger-{mode}.tflite")
        try:
            r = tflite.export_tflite(args.run_dir, path, quantize=mode)
        except Exception as e:  # report and go on: a failed mode is a result too
            results[mode] = {"error": str(e)}
            rows.append((mode, "FAILED", str(e)[:60]))
            continue
        v = verify.verify(args.run_dir, tflite=path, samples=args.samples)["tflite"]
        b = bench.bench(path, run_dir=args.run_dir, threads=args.threads, runs=args.runs)
        results[mode] = {"size_bytes": r.size_bytes, "verify": v, "bench": b}
    for target, quantize in (("gpu", "none"), ("int8", "int8")):
        results[f"static_{target}_check"] = _static_check(args.run_dir, out, quantize, target)

    base = results.get("none", {})
    print(
        f"{'mode':<8} {'size MB':>8} {'ratio':>6} {'max|diff|':>10} {'agree':>7} "
        f"{'acc':>7} {'float':>7} {'LiteRT p50 b1':>14} {'Keras p50 b1':>13} {'speed-up':>8}"
    )
    for mode in ("none", "fp16", "dynamic", "int8"):
        res = results[mode]
        if "error" in res:
            print(f"{mode:<8} FAILED: {res['error']}")
            continue
        v, b = res["verify"], res["bench"]
        ratio = res["size_bytes"] / base["size_bytes"] if "size_bytes" in base else float("nan")
        diff = v["max_abs_diff"].get("probabilities", max(v["max_abs_diff"].values()))
        acc = v["metric"][1] if v.get("metric") else float("nan")
        facc = (
            v["float_metric_same_inputs"][1] if v.get("float_metric_same_inputs") else float("nan")
        )
        lite, keras_ms = b["litert"][1]["p50_ms"], b["keras"][1]["p50_ms"]
        print(
            f"{mode:<8} {res['size_bytes'] / 1e6:>8.3f} {ratio:>6.2f} {diff:>10.2e} "
            f"{v['agreement']:>7.2%} {acc:>7.4f} {facc:>7.4f} {lite:>12.3f}ms {keras_ms:>11.3f}ms "
            f"{keras_ms / lite:>7.1f}x"
        )
    for target in ("gpu", "int8"):
        found = results[f"static_{target}_check"]
        print(
            f"static-shape check --target {target}:",
            "PASS" if not found else f"FAIL ({len(found)})",
        )
        for line in found:
            print("  " + line.replace("\n", "\n  "))
    targets = {}
    if "verify" in results.get("fp16", {}):
        targets["fp16 within 1e-3"] = (
            max(results["fp16"]["verify"]["max_abs_diff"].values()) <= 1e-3
        )
    for mode in ("dynamic", "int8"):
        res = results.get(mode, {})
        if "verify" in res and "size_bytes" in base:
            targets[f"{mode} <= 1/3 size"] = res["size_bytes"] <= base["size_bytes"] / 3
            if res["verify"].get("metric"):
                drop = res["verify"]["float_metric_same_inputs"][1] - res["verify"]["metric"][1]
                targets[f"{mode} within 0.5 acc points"] = drop <= 0.005
    if "bench" in base:
        targets["LiteRT b1 <= 1/3 Keras"] = (
            base["bench"]["litert"][1]["p50_ms"] <= base["bench"]["keras"][1]["p50_ms"] / 3
        )
    for target in ("gpu", "int8"):
        targets[f"static {target} check"] = not results[f"static_{target}_check"]
    for name, ok in targets.items():
        print(f"target {name:<28} {'met' if ok else 'MISSED'}")
    with open(os.path.join(out, "export_bench.json"), "w") as f:
        json.dump({"results": results, "targets": targets}, f, indent=2, default=str)
    print(f"report: {os.path.join(out, 'export_bench.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
