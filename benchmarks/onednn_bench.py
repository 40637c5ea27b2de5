"""TensorFlow's CPU kernels, oneDNN vs Eigen, for each training command, side by side.

    python -m benchmarks.onednn_bench [--quick]

TensorFlow turns its oneDNN kernels on by itself only on x86 CPUs with AVX-512 VNNI /
BF16, AVX-VNNI or AMX; `python -m train sagan` asks for them everywhere on x86
(train.cli.prefer_onednn). Every figure comes from a fresh process with
TF_ENABLE_ONEDNN_OPTS=0 and then =1: the tagger (attention and bilstm) and seq2seq train
2 epochs of their default embedded runs (train seconds from metrics.json), and SAGAN's
steps, built as `python -m train sagan` builds them with its defaults (32x32, 4
classes) but at batch 32, are timed, median of 10 after warm-up. ratio = oneDNN /
Eigen (< 1: oneDNN is faster). Prints a Markdown table.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "tagger (attention)": ["tagger"],
    "tagger (bilstm)": ["tagger", "--arch", "bilstm"],
    "seq2seq": ["seq2seq"],
}
SAGAN_STEPS = ("sagan D step", "sagan D step with R1", "sagan G step")


def _env(onednn):
    return dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONHASHSEED="0",
        TF_ENABLE_ONEDNN_OPTS=str(onednn),
    )


def _train_seconds(argv, onednn, epochs):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        cmd = [sys.executable, "-m", "train", *argv, "--out", out, "--epochs", str(epochs)]
        subprocess.run(cmd, cwd=ROOT, env=_env(onednn), check=True, capture_output=True)
        with open(os.path.join(out, "metrics.json")) as f:
            return float(json.load(f)["train_seconds"])


def _sagan_seconds(onednn, repeats):
    cmd = [sys.executable, "-m", "benchmarks.onednn_bench", "--sagan-child", str(repeats)]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=_env(onednn), check=True, capture_output=True, text=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sagan_child(repeats):
    """In the child: the default SAGAN's D, R1 D and G steps, seconds each (median)."""
    import numpy as np

    from train.engine import At
    from train.sagan import build_trainer

    # The defaults on the embedded data's shape, at batch 32, the batch of the step
    # times in results.md's oneDNN table, so a rerun compares with it.
    _, _, _, trainer, cfg = build_trainer(argv=["--batch-size", "32"])
    batch = cfg["batch_size"]
    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, (batch, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 4, batch).astype("int32")
    for step in range(8):  # traces every step function (the 4th D step carries R1)
        trainer.train((real, labels), At(step, 0.0))
    import tensorflow as tf

    rows = tf.constant(float(batch))
    noise, fake = trainer.latents(0, 0, batch)
    calls = {
        "sagan D step": lambda: trainer.d_step(real, labels, noise, fake, rows)[0],
        "sagan D step with R1": lambda: trainer.d_step_r1(real, labels, noise, fake, rows)[0],
        "sagan G step": lambda: trainer.g_step(noise, fake, rows)[0],
    }
    seconds = {}
    for name, call in calls.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            float(call())
            times.append(time.perf_counter() - start)
        seconds[name] = float(np.median(times))
    return seconds


def run(quick=False):
    epochs, repeats = (1, 3) if quick else (2, 10)
    rows = []
    for name, argv in COMMANDS.items():
        eigen, onednn = (_train_seconds(argv, o, epochs) for o in (0, 1))
        rows.append(dict(model=name, what=f"train s, {epochs} epochs", eigen=eigen, onednn=onednn))
    steps = {o: _sagan_seconds(o, repeats) for o in (0, 1)}
    for name in SAGAN_STEPS:
        rows.append(dict(model=name, what="s a step", eigen=steps[0][name], onednn=steps[1][name]))
    for row in rows:
        row["ratio"] = row["onednn"] / row["eigen"]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sagan-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sagan_child:
        print(json.dumps(sagan_child(args.sagan_child)))
        return 0
    rows = run(args.quick)
    print("| model | figure | Eigen (TF_ENABLE_ONEDNN_OPTS=0) | oneDNN (=1) | oneDNN / Eigen |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['what']} | {r['eigen']:.3g} | {r['onednn']:.3g} | {r['ratio']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
