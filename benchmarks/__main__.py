"""`make bench`: every benchmark, one results file.

    python -m benchmarks [--quick] [--only attention,export,...]

Writes benchmarks/results.json (machine, versions, every row) and
benchmarks/results.md (README links to it). Each section is a module exposing `run(quick) -> list[dict]`;
a section that fails is reported as such and the others still run.
"""

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = {
    "attention": "benchmarks.attention_bench",
    "training": "benchmarks.training_bench",
    "throughput": "benchmarks.throughput_bench",
    "decoding": "benchmarks.decode_bench",
    "export": "benchmarks.export_run",
    "onednn": "benchmarks.onednn_bench",
}
# Sections measured by hand (a "## " heading and what follows, below the generated
# tables) are kept when results.md is written again.
HAND = "\n## "


def hand_sections(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    start = text.find(HAND)
    return text[start:] if start >= 0 else ""


def machine():
    import keras
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown(info, results):
    lines = [
        f"Measured by `make bench` on {info['date']}: {info['cpu']}, {info['cores']} cores, "
        f"Python {info['python']}, TensorFlow {info['tensorflow']}, Keras {info['keras']}. "
        "Times are medians over repeats; every ratio compares two figures taken "
        "side by side in the same run (ratio < 1: ours is faster).",
        "",
    ]
    for section, rows in results.items():
        lines.append(f"**{section}**")
        lines.append("")
        if isinstance(rows, dict) and "error" in rows:
            lines += [f"failed: {rows['error']}", ""]
            continue
        keys = []
        for row in rows:
            keys += [k for k in row if k not in keys and k != "figure"]
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "---|" * len(keys))
        for row in rows:
            lines.append("| " + " | ".join(_fmt(row.get(k, "")) for k in keys) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke run")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    args = parser.parse_args(argv)
    wanted = [s for s in args.only.split(",") if s]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        print(f"error: unknown section(s) {unknown}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2

    info = machine()
    # Sections not run this time keep their last results, so one section can
    # be re-measured without discarding the rest.
    results = {}
    previous = os.path.join(HERE, "results.json")
    if os.path.exists(previous) and set(wanted) != set(SECTIONS):
        with open(previous) as f:
            old = json.load(f)
        if old.get("quick") == args.quick:
            results = {k: v for k, v in old.get("results", {}).items() if k in SECTIONS}
    for section in SECTIONS:
        if section not in wanted:
            continue
        print(f"== {section}", flush=True)
        try:
            module = importlib.import_module(SECTIONS[section])
            results[section] = module.run(args.quick)
        except Exception as error:  # one broken section must not hide the rest
            traceback.print_exc()
            results[section] = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(results[section], indent=1), flush=True)

    results = {k: results[k] for k in SECTIONS if k in results}
    out = {"machine": info, "quick": args.quick, "results": results}
    hand = hand_sections(os.path.join(HERE, "results.md"))
    for name, text in (
        ("results.json", json.dumps(out, indent=2)),
        ("results.md", markdown(info, results) + hand),
    ):
        path = os.path.join(HERE, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    print(markdown(info, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
