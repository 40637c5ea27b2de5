"""Figure 6 for `make bench`: exported tagger, LiteRT vs Keras, sizes.

Trains a short attention tagger on the embedded data into a temporary run
directory, then runs `benchmarks.export_bench` on it (float, fp16, dynamic
and int8 exports; parity, accuracy, latency, GPU check).
"""

import json
import os
import subprocess
import sys
import tempfile


def run(quick=False):
    work = tempfile.mkdtemp(prefix="bench-export-")
    run_dir = os.path.join(work, "tagger")
    epochs = "1" if quick else "4"
    subprocess.run(
        [sys.executable, "-m", "train", "tagger", "--epochs", epochs, "--out", run_dir],
        check=True,
        capture_output=True,
        text=True,
    )
    out = os.path.join(work, "exports")
    from benchmarks import export_bench

    export_bench.main([run_dir, "--out", out, "--runs", "20" if quick else "100"])
    with open(os.path.join(out, "export_bench.json")) as f:
        report = json.load(f)
    rows = []
    for mode, result in report["results"].items():
        if not isinstance(result, dict):
            continue
        if "error" in result:
            rows.append({"figure": "export", "mode": mode, "error": result["error"][:120]})
            continue
        row = {"figure": "export", "mode": mode, "size_mb": result["size_bytes"] / 1e6}
        bench = result.get("bench", {})
        for side in ("litert", "keras"):
            for batch, stats in bench.get(side, {}).items():
                row[f"{side}_b{batch}_p50_ms"] = stats["p50_ms"]
        if "litert" in bench and "keras" in bench:
            first = min(bench["litert"], key=int)
            row["litert/keras_b1"] = (
                bench["litert"][first]["p50_ms"] / bench["keras"][first]["p50_ms"]
            )
        rows.append(row)
    for check in ("gpu", "int8"):
        rows.append(
            {
                "figure": "export",
                "mode": f"static {check} check",
                "problems": len(report["results"].get(f"static_{check}_check", [])),
            }
        )
    for target, met in report.get("targets", {}).items():
        rows.append({"figure": "export", "mode": f"target: {target}", "met": met})
    return rows
